from __future__ import annotations

import copy
import json

import pytest

from ggpo_batch.nightly.component_record import (
    aggregate,
    check_component_record,
    summarize,
)
from tests.support.paths import SEED_003


@pytest.fixture
def seed_record() -> dict:
    return json.loads(SEED_003.read_text())


def test_seed_003_conforms_and_its_metrics_are_reproduced(seed_record):
    assert check_component_record(seed_record) == []
    got = aggregate(seed_record["per_seed"])
    for key, want in seed_record["metrics"].items():
        assert got[key]["n"] == want["n"]
        assert got[key]["mean"] == pytest.approx(want["mean"], rel=1e-12, abs=1e-15)
        assert got[key]["std"] == pytest.approx(want["std"], rel=1e-12, abs=1e-15)


def test_summarize_uses_sample_std_and_none_for_one_seed():
    assert summarize([120, 178, 113]) == {"mean": 137, "std": pytest.approx(35.679125549822544), "n": 3}
    assert summarize([0.5]) == {"mean": 0.5, "std": None, "n": 1}


@pytest.mark.parametrize("mutate, needle", [
    (lambda r: r["metrics"]["final_test_nll"].update(mean=1.0), "metrics.final_test_nll"),
    (lambda r: r["per_seed"][0]["history"][0].update(extra=1), "unexpected key 'extra'"),
    (lambda r: r["per_seed"][1].pop("reward"), "per_seed[1]: missing key 'reward'"),
    (lambda r: r["execution_checks"].update(frozen_teacher_unchanged="yes"), "execution_checks.frozen_teacher"),
    (lambda r: r.update(promotion_eligible=True), "promotion_eligible"),
    (lambda r: r["dataset"]["byte_ranges"].update(validation=[165000, 186205]), "contiguous"),
    (lambda r: r["per_seed"].reverse(), "order included"),
    (lambda r: r["per_seed"][2]["history"].pop(), "student_steps is 2"),
])
def test_departures_are_named(seed_record, mutate, needle):
    rec = copy.deepcopy(seed_record)
    mutate(rec)
    problems = check_component_record(rec)
    assert any(needle in p for p in problems), problems
