"""The one home of what an `events` row says and of the check every run move passes, for both
ways the ledger writes them: ORM sessions (`LedgerCore._event`, `_move`) and the worker's
row-level transitions (`RowEvents`, Core inserts). An event worth telling people about (a run
failed or lost, a cost decision: `notify.kinds`) puts its notification in the outbox here, in the
event's own transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert

from ..contracts import notices as kinds
from ..contracts.states import REASON_TO_LEAVE, can_move
from ..errors import LedgerError
from .schema import Decision, Event, Notification, Run, utcnow

# Built once, not per transition. Inline: no RETURNING of the new id,
# which nothing reads, so the insert can be sent without waiting for a reply (commit_after).
_INSERT_EVENT = insert(Event.__table__).inline()
_INSERT_NOTIFICATION = insert(Notification.__table__).inline()


def event_row(*, entity: str, to_state: str, actor: str, from_state: str | None = None, reason: str | None = None,
              experiment_id: int | None = None, run: Run | None = None, attempt_id: int | None = None
              ) -> dict[str, Any]:
    """The columns of one event (all but its time): the experiment is the run's unless given."""
    return {"entity": entity, "from_state": from_state, "to_state": to_state, "actor": actor, "reason": reason,
            "experiment_id": experiment_id if experiment_id is not None else (run.experiment_id if run else None),
            "run_id": run.id if run else None, "attempt_id": attempt_id}


def notice_of(*, entity: str, to_state: str, actor: str, reason: str | None = None, run: Run | None = None,
              attempt_id: int | None = None, decision: Decision | None = None) -> kinds.Notice | None:
    """The notification an event makes, or None (most make none)."""
    if entity == "run" and run is not None:
        return kinds.run_moved(run_key=run.run_key, arm=run.arm, seed=run.seed, experiment_id=run.experiment_id,
                               to_state=to_state, reason=reason, actor=actor, attempt_id=attempt_id)
    if entity == "canary" and to_state == "failed" and run is not None:
        return kinds.canary_failed(run_key=run.run_key, experiment_id=run.experiment_id, reason=reason, actor=actor,
                                   attempt_id=attempt_id)
    if entity == "decision" and decision is not None:
        return kinds.decided(decision_id=decision.id, experiment_name=decision.experiment_name,
                             experiment_id=decision.experiment_id, kind=decision.kind, actor=actor,
                             estimated_gpu_hours=decision.estimated_gpu_hours, cap_gpu_hours=decision.cap_gpu_hours,
                             reason=reason)
    return None


def notification_row(notice: kinds.Notice, *, due: bool = True) -> dict[str, Any]:
    """The outbox row of a notice: due for delivery now (or, with `due` False, recorded only)."""
    now = utcnow()
    return {"dedupe_key": notice.dedupe_key, "key": notice.sent_key(), "kind": notice.kind,
            "subject": notice.subject, "fields": notice.fields, "experiment_id": notice.experiment_id,
            "created_at": now, "next_try_at": now if due else None}


def check_move(run: Run, to: str, reason: str | None) -> None:
    """Refuse a run move the state machine does not allow, or one that leaves a state without the
    reason it needs."""
    if not can_move(run.state, to):
        raise LedgerError(f"run {run.run_key}: cannot go from {run.state} to {to}")
    if run.state in REASON_TO_LEAVE and not reason:
        raise LedgerError(f"run {run.run_key}: leaving {run.state} needs a reason")


class RowEvents:
    """The events of a transition written as rows (Core) rather than ORM objects: the hot path of
    a worker's job (ledger/attempts.py), where ORM flushes cost most of a job's ledger time."""

    def __init__(self, actor: str) -> None:
        self.actor = actor
        self.rows: list[dict[str, Any]] = []
        self.notices: list[kinds.Notice] = []

    def add(self, *, entity: str, to_state: str, run: Run, attempt_id: int | None, from_state: str | None = None,
            reason: str | None = None) -> None:
        self.rows.append(event_row(entity=entity, to_state=to_state, actor=self.actor, from_state=from_state,
                                   reason=reason, run=run, attempt_id=attempt_id))
        notice = notice_of(entity=entity, to_state=to_state, actor=self.actor, reason=reason, run=run,
                           attempt_id=attempt_id)
        if notice is not None:
            self.notices.append(notice)

    def move(self, run: Run, to: str, reason: str | None, attempt_id: int | None) -> None:
        """`LedgerCore._move` on a run read as a row: checked, recorded, applied to `run`."""
        check_move(run, to, reason)
        self.add(entity="run", from_state=run.state, to_state=to, reason=reason, run=run, attempt_id=attempt_id)
        run.state = to
        run.updated_at = utcnow()

    def write(self, conn: Connection) -> None:
        if self.rows:
            at = utcnow()
            conn.execute(_INSERT_EVENT, [{"at": at, **row} for row in self.rows])
        if self.notices:
            conn.execute(_INSERT_NOTIFICATION, [notification_row(n) for n in self.notices])
