"""The ledger's figures an operator watches, read in a few GROUP BY queries: what the dashboard's
`/metrics` exposes at scrape time (reporting/ledger_metrics.py).

Like `status`' totals (summaries.py), nothing here reads a run row by row: runs are counted per
(queue, state) from the `ix_runs_status_totals` index, attempts per queue through their run index,
and the outbox by its `next_try_at` index and the deliveries' (sink, state) index; so a scrape costs
about the same at 100,000 runs as at 1,000 (tools/bench/metrics_scrape.py measures it beside `status`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import case, func, select

from ..contracts.states import IN_FLIGHT_ATTEMPT_STATES
from .core import LedgerCore
from .schema import Attempt, Experiment, Notification, NotificationDelivery, Run


@dataclass
class LedgerFigures:
    """Counts at one moment. Queue None: the experiments that name none (the installation's default)."""

    runs: dict[tuple[str | None, str], int] = field(default_factory=dict)  # (queue, run state) -> runs
    active_attempts: dict[str | None, int] = field(default_factory=dict)  # queue -> attempts in flight
    gpu_hours: dict[str | None, float] = field(default_factory=dict)  # queue -> GPU-hours booked, every attempt
    outbox_pending: int = 0  # notifications with a delivery still due
    outbox_failed: int = 0  # deliveries given up for good
    outbox_oldest_pending: datetime | None = None  # when the oldest pending notification was written


class GaugeReads(LedgerCore):
    """The figures of `LedgerFigures`, in one read-only transaction."""

    def ledger_figures(self) -> LedgerFigures:
        """Runs per (queue, state), attempts in flight and GPU-hours booked per queue, the outbox."""
        out = LedgerFigures()
        cost = func.coalesce(Attempt.gpu_hours_scheduler, Attempt.gpu_hours_job)
        in_flight = func.sum(case((Attempt.state.in_(IN_FLIGHT_ATTEMPT_STATES), 1), else_=0))
        with self.reading() as conn:
            per_experiment = (select(Run.experiment_id, Run.state, func.count().label("n"))
                              .group_by(Run.experiment_id, Run.state).subquery())
            for queue, state, n in conn.execute(
                    select(Experiment.queue, per_experiment.c.state, func.sum(per_experiment.c.n))
                    .join(per_experiment, per_experiment.c.experiment_id == Experiment.id)
                    .group_by(Experiment.queue, per_experiment.c.state)):
                out.runs[(queue, state)] = int(n or 0)
            for queue, active, gh in conn.execute(
                    select(Experiment.queue, in_flight, func.sum(cost)).select_from(Attempt)
                    .join(Run, Run.id == Attempt.run_id).join(Experiment, Experiment.id == Run.experiment_id)
                    .group_by(Experiment.queue)):
                out.active_attempts[queue] = int(active or 0)
                out.gpu_hours[queue] = float(gh or 0.0)
            n, d = Notification.__table__.c, NotificationDelivery.__table__.c
            pending, oldest = conn.execute(select(func.count(), func.min(n.created_at))
                                           .where(n.next_try_at.is_not(None))).one()
            out.outbox_pending, out.outbox_oldest_pending = int(pending or 0), _aware(oldest)
            out.outbox_failed = int(conn.scalar(select(func.count()).select_from(NotificationDelivery.__table__)
                                                .where(d.state == "failed")) or 0)
        return out


def _aware(value: datetime | str | None) -> datetime | None:
    """A timestamp from a Core query (SQLite hands back naive datetimes or text), as aware UTC."""
    from datetime import UTC

    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
