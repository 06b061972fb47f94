from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from ggpo_batch.control.importer import import_results
from ggpo_batch.errors import RecordError
from ggpo_batch.reporting.status import experiment_status
from tests.support.paths import SEED_000


def _seed() -> dict:
    return json.loads(SEED_000.read_text())


def _expected_per_arm() -> dict[str, float]:
    per_arm: dict[str, float] = defaultdict(float)
    for rec in _seed().values():
        per_arm[rec["arm"]] += rec["timing"]["allocated_gpu_hours_through_evaluation"]
    return per_arm


def test_import_seed_gives_per_arm_and_total_gpu_hours(ledger) -> None:  # type: ignore[no-untyped-def]
    rep = import_results(ledger, SEED_000, actor="tester")
    assert rep.created and rep.runs == 15
    [exp] = experiment_status(ledger)
    assert exp["totals"]["states"] == {"succeeded": 15}
    assert exp["totals"]["attempts"] == 15
    want = _expected_per_arm()
    assert set(exp["arms"]) == set(want)
    for arm, tot in exp["arms"].items():
        assert tot["allocated_gpu_hours"] == pytest.approx(want[arm], rel=1e-12)
        assert tot["runs"] == 3
    assert exp["totals"]["allocated_gpu_hours"] == pytest.approx(sum(want.values()), rel=1e-12)
    assert exp["totals"]["allocated_gpu_hours"] == pytest.approx(57.29736219114727, rel=1e-12)
    steps = sum(r["training"]["counts"]["steps"] for r in _seed().values())
    assert exp["totals"]["steps"] == steps


def test_import_twice_changes_nothing(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="tester")
    n_events = len(ledger.events())
    rep = import_results(ledger, SEED_000, actor="tester")
    assert not rep.created
    assert len(ledger.events()) == n_events
    assert len(ledger.runs()) == 15


def test_import_refuses_broken_invariant_and_writes_nothing(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = _seed()
    data["20261013/paired"]["timing"]["allocated_gpu_hours_through_evaluation"] += 0.5
    data["20261014/clean"]["budget"]["overshoot_seconds"] = 1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(RecordError) as err:
        import_results(ledger, bad, actor="tester")
    msg = str(err.value)
    assert "2 problem(s)" in msg
    assert "20261013/paired.timing.allocated_gpu_hours_through_evaluation" in msg
    assert "20261014/clean.budget.overshoot_seconds" in msg
    assert ledger.experiments() == [] and ledger.runs() == [] and ledger.events() == []


def test_import_refuses_truncated_file(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    raw = SEED_000.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(RecordError, match="not valid JSON"):
        import_results(ledger, cut, actor="tester")
    assert ledger.experiments() == []


def test_import_same_name_different_content_is_refused(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="tester")
    data = _seed()
    del data["20261012/clean"]
    other = tmp_path / SEED_000.name
    other.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="different content"):
        import_results(ledger, other, actor="tester")
    rep = import_results(ledger, other, actor="tester", name="subset")
    assert rep.created and rep.runs == 14
