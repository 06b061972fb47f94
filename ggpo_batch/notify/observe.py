"""The events no transition makes, seen by reconcile and recorded once each (by dedupe key): a
running attempt gone silent (hung), an experiment version with nothing left to run (finished, with
its report's headline), and the nightly tier's moved metrics and missed nights."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..contracts import notices as kinds
from ..ledger.schema import utcnow

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..ledger import Ledger

log = logging.getLogger(__name__)

# A scheduled night counts as missed once this long has passed with no run claimed for it.
NIGHT_GRACE = timedelta(hours=1)
# Nights looked back on for moved metrics and missed nights: older ones were told, or are history.
NIGHTS_WATCHED = 2
MAX_FINISHED_PER_PASS = 20


def observe(ledger: Ledger, settings: Settings, *, now: datetime | None = None) -> int:
    """Record what this pass sees; returns how many notices were new."""
    now = now or utcnow()
    new = ledger.record_notices(hung_runs(ledger, settings.hung_after_seconds, now))
    new += _finished(ledger, settings, now)
    new += ledger.record_notices(nightly(ledger, now))
    return new


def hung_runs(ledger: Ledger, hung_after: float, now: datetime) -> list[kinds.Notice]:
    """A notice per running attempt silent for more than `hung_after` seconds."""
    rows = ledger.hung_attempts(now - timedelta(seconds=hung_after))
    return [kinds.hung(run_key=r["run_key"], attempt_id=r["attempt_id"], attempt=r["number"], job_id=r["job_id"],
                       experiment_id=r["experiment_id"], silent_seconds=(now - r["since"]).total_seconds(),
                       last_step=r["heartbeat_step"], hung_after_seconds=hung_after) for r in rows]


def _finished(ledger: Ledger, settings: Settings, now: datetime) -> int:
    """Record each newly finished experiment version with its headline. One that finished longer
    ago than notifications are retried for (before the outbox existed) is recorded as told."""
    from ..reporting.headline import headline
    from ..reporting.report import experiment_report

    new = 0
    old = now - timedelta(seconds=settings.notify.give_up_seconds)
    for f in ledger.finished_unannounced(MAX_FINISHED_PER_PASS):
        if f.finished_at is not None and f.finished_at < old:  # history: recorded as told, no report read
            new += ledger.record_notices([kinds.experiment_finished(
                name=f.name, version=f.version, experiment_id=f.experiment_id, states={}, spent_gpu_hours=0.0,
                headline=f"{f.name} v{f.version} finished before notifications were sent")], due=False)
            continue
        report = experiment_report(ledger, f.name, version=f.version)
        states: dict[str, int] = {}
        for arm in report["arms"].values():
            for state, count in arm["states"].items():
                states[state] = states.get(state, 0) + count
        notice = kinds.experiment_finished(name=f.name, version=f.version, experiment_id=f.experiment_id,
                                           headline=headline(report), states=states,
                                           spent_gpu_hours=report["totals"]["spent_gpu_hours"])
        new += ledger.record_notices([notice])
    return new


def nightly(ledger: Ledger, now: datetime) -> list[kinds.Notice]:
    """Notices of the nightly tier's last nights: metrics that moved, nights with no run. Only for
    methods that have run at least once (a ledger without a nightly tier is never told it misses one)."""
    if not ledger.component_runs(limit=1):
        return []
    from ..nightly.history import component_status
    from ..nightly.suite import load_suite

    data = component_status(ledger, cron=load_suite().schedule.cron, nights=NIGHTS_WATCHED, now=now - NIGHT_GRACE)
    out: list[kinds.Notice] = []
    for m in data["methods"]:
        for row in m["nights"]:
            if row["moved"]:
                out.append(kinds.nightly_moved(method=m["method"], night=row["night"],
                                               compared_with=row["compared_with"], moved=row["moved"]))
        out += [kinds.nightly_missed(method=m["method"], night=night) for night in m["missed_nights"]]
    return out

