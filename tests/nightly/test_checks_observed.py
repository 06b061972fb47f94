"""Every execution check of the nightly tier is an observation: it can come out either way, and one
this tier cannot observe is "not_applicable" (as in the reference record), never a fixed value."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.nightly import ggpo_tier
from ggpo_batch.nightly.component_record import (
    CHECK_KEYS,
    FACT_CHECKS,
    check_component_record,
)
from ggpo_batch.nightly.policy import sample
from ggpo_batch.nightly.runner import run_nightly
from ggpo_batch.nightly.suite import load_suite


def _run(tiny_suite_path: Path) -> dict:
    return run_nightly(seeds=[1, 2], methods=["ggpo"], corpus=None, corpus_sha256=None, output=None,
                       command="pytest", suite=load_suite(tiny_suite_path))


@pytest.mark.slow
def test_teacher_self_generation_is_observed_not_fixed(tiny_suite_path: Path, monkeypatch: pytest.MonkeyPatch):
    plain = _run(tiny_suite_path)["execution_checks"]
    assert plain["actual_teacher_self_generation"] is False  # the ggpo teacher only learns NLL: observed, false

    real_fit = ggpo_tier._fit_nll

    def fit_then_self_generate(model, split, steps, budgets, gen):  # a tier whose teacher writes its own text
        real_fit(model, split, steps, budgets, gen)
        sample(model, split.train_windows(gen, 1, budgets.prompt_bytes)[0], 2, budgets.max_new_tokens, gen)

    monkeypatch.setattr(ggpo_tier, "_fit_nll", fit_then_self_generate)
    rec = _run(tiny_suite_path)
    assert check_component_record(rec) == []
    checks = rec["execution_checks"]
    assert checks["actual_teacher_self_generation"] is True
    # the teacher's sampling is its own: the student's online-sampling check is not disturbed by it
    assert checks["actual_online_student_sampling"] is True


def test_checks_are_booleans_or_not_applicable(tiny_suite_path: Path):
    checks = _run(tiny_suite_path)["execution_checks"]
    assert tuple(checks) == CHECK_KEYS
    for key, value in checks.items():
        assert isinstance(value, bool) or value == "not_applicable", (key, value)
    # the facts this tier observes are booleans; the components it does not run are not_applicable
    assert isinstance(checks["actual_teacher_self_generation"], bool)
    assert set(FACT_CHECKS) <= set(CHECK_KEYS)
