"""The notifications outbox in the ledger: what reconcile observes and records (once, by dedupe
key), what is due for delivery, the claim that keeps two reconcilers from sending one notice at
the same moment, and each delivery's outcome. The notices of transitions are written by the
transitions themselves (`events.notice_of`), in their own transaction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, insert, select, update

from ..contracts.notices import EXPERIMENT_FINISHED, Notice
from ..contracts.states import RECORD_RUN_STATES, UNFINISHED_RUN_STATES
from .core import LedgerCore
from .events import notification_row
from .heartbeats import HUNG_SINCE
from .schema import Attempt, Experiment, Notification, NotificationDelivery, Run

_N, _D = Notification.__table__, NotificationDelivery.__table__


def _queries() -> tuple[Any, Any]:
    """Reconcile's two looks at every pass, built once per process (building them costs more than
    running them on a small ledger)."""
    r, a, e, n = Run.__table__.c, Attempt.__table__.c, Experiment.__table__.c, _N.c
    hung = (select(r.run_key, r.experiment_id, a.id.label("attempt_id"), a.number, a.job_id, a.heartbeat_step,
                   HUNG_SINCE.label("since"))
            .join_from(Attempt.__table__, Run.__table__, r.id == a.run_id)
            .where(r.state == "running", a.state == "running", HUNG_SINCE < bindparam("cutoff")).order_by(a.id))
    unfinished = exists().where(r.experiment_id == e.id, r.state.in_(sorted(UNFINISHED_RUN_STATES)))
    ended = exists().where(r.experiment_id == e.id, r.state.in_(sorted(RECORD_RUN_STATES)))
    told = exists().where(n.experiment_id == e.id, n.kind == EXPERIMENT_FINISHED)
    last = select(func.max(r.updated_at)).where(r.experiment_id == e.id).scalar_subquery()
    finished = (select(e.id, e.name, e.version, last.label("finished_at"))
                .where(~told, e.source != "import", ended, ~unfinished).order_by(e.id).limit(bindparam("limit")))
    return hung, finished


_HUNG, _FINISHED = _queries()


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one try (or a decision not to try) left of a notification's delivery to one sink."""

    sink: str
    state: str  # retrying | delivered | failed
    tries: int
    next_try_at: datetime | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None


@dataclass(frozen=True)
class Finished:
    """An experiment version with no run left to run, not announced yet."""

    experiment_id: int
    name: str
    version: int
    finished_at: datetime | None


class NotificationRecords(LedgerCore):
    """The outbox: record observed events once, list what is due, book deliveries."""

    def record_notices(self, notices: Sequence[Notice], *, due: bool = True) -> int:
        """Write the notices not recorded yet (by dedupe key); returns how many were new. With
        `due` False they are recorded as told already (an event from before anyone could be told)."""
        if not notices:
            return 0
        with self.transaction() as conn:
            return _insert_new(conn, [notification_row(n, due=due) for n in notices])

    def hung_attempts(self, cutoff: datetime) -> list[dict[str, Any]]:
        """Running attempts (of running runs) with no sign of life since `cutoff`."""
        with self.reading() as conn:
            return [dict(row._mapping) for row in conn.execute(_HUNG, {"cutoff": cutoff})]

    def finished_unannounced(self, limit: int = 20) -> list[Finished]:
        """Experiment versions (not imported) with a run that ended and none left queued, submitted
        or running, that have no experiment_finished notification yet."""
        with self.reading() as conn:
            return [Finished(*row) for row in conn.execute(_FINISHED, {"limit": limit})]

    def due_notifications(self, now: datetime, limit: int) -> list[tuple[Notification, dict[str, NotificationDelivery]]]:
        """Notifications whose next delivery is due, oldest first, each with its deliveries by sink."""
        with self.session() as s:
            rows = list(s.scalars(select(Notification).where(Notification.next_try_at <= now)
                                  .order_by(Notification.next_try_at, Notification.id).limit(limit)))
            return [(n, d) for n, d in zip(rows, _deliveries(s, [n.id for n in rows]))]

    def claim_notification(self, notification_id: int, *, now: datetime, until: datetime) -> bool:
        """Take a due notification for delivery until `until` (a reconciler that dies mid-delivery
        leaves it to the next after that); False if another reconciler took it first."""
        with self.transaction() as conn:
            done = conn.execute(update(_N).where(_N.c.id == notification_id, _N.c.next_try_at <= now)
                                .values(next_try_at=until))
            return done.rowcount == 1

    def save_deliveries(self, notification_id: int, outcomes: Sequence[DeliveryOutcome],
                        next_try_at: datetime | None) -> None:
        """Book the outcomes of a notification's deliveries, and when it is next due (None: never)."""
        with self.session() as s:
            have = {d.sink: d for d in s.scalars(select(NotificationDelivery)
                                                 .where(NotificationDelivery.notification_id == notification_id))}
            for o in outcomes:
                d = have.get(o.sink)
                if d is None:
                    d = NotificationDelivery(notification_id=notification_id, sink=o.sink)
                    s.add(d)
                d.state, d.tries, d.next_try_at = o.state, o.tries, o.next_try_at
                d.last_error, d.delivered_at = o.last_error, o.delivered_at
            s.execute(update(Notification).where(Notification.id == notification_id).values(next_try_at=next_try_at))

    def sinks_down_until(self, sinks: Sequence[str], now: datetime) -> dict[str, datetime]:
        """Sinks in back-off: each one's earliest retry still in the future. A sink that failed is
        tried again for one notice at a time, then, if it answers, for the rest."""
        if not sinks:
            return {}
        d = _D.c
        q = (select(d.sink, func.min(d.next_try_at)).where(d.sink.in_(list(sinks)), d.state == "retrying")
             .group_by(d.sink))
        with self.reading() as conn:
            return {sink: at for sink, at in conn.execute(q) if at is not None and at > now}

    def notifications(self, *, undelivered: bool = True,
                      limit: int = 100) -> list[tuple[Notification, dict[str, NotificationDelivery]]]:
        """Notifications, newest first, each with its deliveries; with `undelivered`, only those
        still due or with a delivery that failed."""
        with self.session() as s:
            q = select(Notification).order_by(Notification.id.desc()).limit(limit)
            if undelivered:
                failed = exists().where(_D.c.notification_id == Notification.id, _D.c.state == "failed")
                q = q.where(Notification.next_try_at.is_not(None) | failed)
            rows = list(s.scalars(q))
            return [(n, d) for n, d in zip(rows, _deliveries(s, [n.id for n in rows]))]

    def sink_summary(self) -> dict[str, dict[str, Any]]:
        """Per sink: how many deliveries are in each state, the earliest retry due, the last error
        of a delivery not (yet) made."""
        d = _D.c
        out: dict[str, dict[str, Any]] = {}
        with self.reading() as conn:
            for sink, state, count, due in conn.execute(select(d.sink, d.state, func.count(), func.min(d.next_try_at))
                                                        .group_by(d.sink, d.state)):
                row = out.setdefault(sink, {"delivered": 0, "retrying": 0, "failed": 0, "next_try_at": None,
                                            "last_error": None})
                row[state] = int(count)
                if state == "retrying":
                    row["next_try_at"] = due
            for sink, error in conn.execute(select(d.sink, d.last_error).where(d.state != "delivered",
                                                                               d.last_error.is_not(None))
                                            .order_by(d.id.desc()).limit(1000)):
                if out[sink]["last_error"] is None:
                    out[sink]["last_error"] = error
        return out

    def notification_counts(self) -> Mapping[str, int]:
        """How many notifications are pending (still due) and how many deliveries failed for good."""
        with self.reading() as conn:
            pending = conn.scalar(select(func.count()).select_from(_N).where(_N.c.next_try_at.is_not(None)))
            failed = conn.scalar(select(func.count()).select_from(_D).where(_D.c.state == "failed"))
        return {"pending": int(pending or 0), "failed_deliveries": int(failed or 0)}


def _deliveries(s: Any, ids: Sequence[int]) -> list[dict[str, NotificationDelivery]]:
    by: dict[int, dict[str, NotificationDelivery]] = {i: {} for i in ids}
    if ids:
        for d in s.scalars(select(NotificationDelivery).where(NotificationDelivery.notification_id.in_(list(ids)))):
            by[d.notification_id][d.sink] = d
    return [by[i] for i in ids]


def _insert_new(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Insert outbox rows, skipping those whose dedupe key is there already (ON CONFLICT DO NOTHING)."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as dialect_insert
    elif conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as dialect_insert
    else:  # pragma: no cover (the ledger runs on these two)
        have = set(conn.scalars(select(_N.c.dedupe_key).where(_N.c.dedupe_key.in_([r["dedupe_key"] for r in rows]))))
        fresh = [r for r in rows if r["dedupe_key"] not in have]
        if fresh:
            conn.execute(insert(_N), fresh)
        return len(fresh)
    result = conn.execute(dialect_insert(_N).values(rows).on_conflict_do_nothing(index_elements=["dedupe_key"]))
    return int(result.rowcount or 0)

