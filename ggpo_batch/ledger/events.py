"""The one home of what an `events` row says and of the check every run move passes, for both
ways the ledger writes them: ORM sessions (`LedgerCore._event`, `_move`) and the worker's
row-level transitions (`RowEvents`, Core inserts)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, insert

from ..errors import LedgerError
from ..states import REASON_TO_LEAVE, can_move
from .schema import Event, Run, utcnow

# Built once, not per transition. Inline: no RETURNING of the new id,
# which nothing reads, so the insert can be sent without waiting for a reply (commit_after).
_INSERT_EVENT = insert(Event.__table__).inline()


def event_row(*, entity: str, to_state: str, actor: str, from_state: str | None = None, reason: str | None = None,
              experiment_id: int | None = None, run: Run | None = None, attempt_id: int | None = None
              ) -> dict[str, Any]:
    """The columns of one event (all but its time): the experiment is the run's unless given."""
    return {"entity": entity, "from_state": from_state, "to_state": to_state, "actor": actor, "reason": reason,
            "experiment_id": experiment_id if experiment_id is not None else (run.experiment_id if run else None),
            "run_id": run.id if run else None, "attempt_id": attempt_id}


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

    def add(self, *, entity: str, to_state: str, run: Run, attempt_id: int | None, from_state: str | None = None,
            reason: str | None = None) -> None:
        self.rows.append(event_row(entity=entity, to_state=to_state, actor=self.actor, from_state=from_state,
                                   reason=reason, run=run, attempt_id=attempt_id))

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
