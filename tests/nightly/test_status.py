from __future__ import annotations

import copy
import json
from datetime import date, datetime, timezone

import pytest

from ggpo_batch.nightly.history import component_status, moved_metrics
from ggpo_batch.nightly.schedule import (
    expected_nights,
    missed_nights,
    next_run_after,
    night_of,
)
from tests.support.paths import SEED_003

CRON = "30 2 * * *"


@pytest.fixture
def seed_record() -> dict:
    return json.loads(SEED_003.read_text())


def _finish(ledger, night: str, record, state: str = "succeeded"):
    cr = ledger.claim_night(method="ggpo", tier="l1_mechanism", night=night, actor="t")
    ledger.finish_component_run(cr.id, state=state, record=record, seconds=1.0, commit="c" * 40, dirty=False,
                                error=None if state == "succeeded" else "boom")


def test_moved_metrics_relative_and_from_zero(seed_record):
    cur = copy.deepcopy(seed_record)
    cur["metrics"]["final_test_nll"]["mean"] *= 1.2
    cur["metrics"]["frozen_teacher_parameter_delta_l2"]["mean"] = 0.01  # a frozen teacher moved
    moved = {m["metric"]: m for m in moved_metrics(cur, seed_record, 0.1)}
    assert set(moved) == {"final_test_nll", "frozen_teacher_parameter_delta_l2"}
    assert moved["final_test_nll"]["relative_change"] == pytest.approx(0.2)
    assert moved["frozen_teacher_parameter_delta_l2"]["relative_change"] is None
    assert moved_metrics(seed_record, seed_record, 0.0) == []


def test_status_lists_nights_moves_failures_and_missed_nights(nightly_ledger, seed_record):
    later = copy.deepcopy(seed_record)
    later["metrics"]["generated_tokens"]["mean"] = 200
    later["execution_checks"]["frozen_teacher_unchanged"] = False
    _finish(nightly_ledger, "2026-11-27", seed_record)
    _finish(nightly_ledger, "2026-11-28", None, state="failed")
    _finish(nightly_ledger, "2026-11-30", later)
    now = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    data = component_status(nightly_ledger, cron=CRON, nights=7, threshold=0.25, now=now)
    [m] = data["methods"]
    assert [n["night"] for n in m["nights"]] == ["2026-11-30", "2026-11-28", "2026-11-27"]
    newest, failed, oldest = m["nights"]
    assert newest["compared_with"] == "2026-11-27"  # the previous *succeeded* night
    assert [x["metric"] for x in newest["moved"]] == ["generated_tokens"]
    # a fact check (teacher self-generation: false in seed 003) is not a failure; a broken guarantee is
    assert newest["failed_checks"] == ["frozen_teacher_unchanged"] and oldest["failed_checks"] == []
    assert failed["state"] == "failed" and failed["error"] == "boom" and oldest["moved"] == []
    # nights before the first recorded one (11-25, 11-26) predate the schedule and are not missed
    assert m["missed_nights"] == ["2026-11-29", "2026-12-01"]


def test_status_shows_a_method_that_never_ran(nightly_ledger):
    now = datetime(2026, 12, 1, 3, 0, tzinfo=timezone.utc)
    data = component_status(nightly_ledger, cron=CRON, nights=2, now=now, methods=["ggpo"])
    assert data["methods"] == [{"method": "ggpo", "nights": [], "missed_nights": ["2026-11-30", "2026-12-01"]}]


def test_schedule_arithmetic():
    t = datetime(2026, 12, 1, 2, 29, tzinfo=timezone.utc)
    assert next_run_after(CRON, t) == datetime(2026, 12, 1, 2, 30, tzinfo=timezone.utc)
    assert next_run_after(CRON, t.replace(minute=30)) == datetime(2026, 12, 2, 2, 30, tzinfo=timezone.utc)
    assert night_of(datetime(2026, 12, 1, 23, 30, tzinfo=timezone(-__import__("datetime").timedelta(hours=5)))) \
        == date(2026, 12, 2)
    with pytest.raises(ValueError):
        night_of(datetime(2026, 12, 1))
    start, end = t.replace(day=1, hour=0), datetime(2026, 12, 4, 1, tzinfo=timezone.utc)
    assert expected_nights(CRON, start, end) == [date(2026, 12, 1), date(2026, 12, 2), date(2026, 12, 3)]
    assert missed_nights(CRON, [date(2026, 12, 2)], start, end) == [date(2026, 12, 1), date(2026, 12, 3)]
