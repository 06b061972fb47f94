"""New evaluation rows, written by the transaction that decides them: `evaluate`'s (ledger/
evaluation_rows.py) or the one that books a run's success and queues its spec's [[evaluations]]
(ledger/attempts.py). Inserts only, no read, so the worker's pipelined commit may carry them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, insert

from ..contracts.states import evaluation_can_move
from ..errors import LedgerError
from .events import RowEvents
from .schema import Evaluation, Run, utcnow

_INSERT = insert(Evaluation.__table__).inline()


@dataclass(frozen=True)
class NewEvaluation:
    """An evaluation to add: queued (or failed, with its cause, when it cannot run)."""

    run_id: int
    key: str
    name: str
    source: str  # command | spec
    spec: Mapping[str, Any]
    gpus: int
    state: str = "queued"
    cause: str | None = None


class _Named(Protocol):
    name: str


def reason_of(ev: _Named, text: str | None = None) -> str:
    """An evaluation's event reason: `evaluation NAME[: text]` (the event row has no evaluation column)."""
    return f"evaluation {ev.name}" + (f": {text}" if text else "")


def write_new_evaluations(conn: Connection, new: Sequence[tuple[Run, NewEvaluation]], events: RowEvents, *,
                          actor: str) -> None:
    """Insert evaluation rows and add their events to `events`, which the caller writes in the same
    transaction."""
    if not new:
        return
    now = utcnow()
    rows = []
    for run, n in new:
        if not evaluation_can_move(None, n.state):
            raise LedgerError(f"an evaluation starts queued or failed, not {n.state}")
        rows.append({"run_id": n.run_id, "key": n.key, "name": n.name, "state": n.state, "source": n.source,
                     "spec": dict(n.spec), "gpus": n.gpus, "cause": n.cause, "created_by": actor,
                     "created_at": now, "updated_at": now})
        events.add(entity="evaluation", to_state=n.state, run=run, attempt_id=None,
                   reason=reason_of(n, n.cause or f"of {n.spec.get('data_path')} on {n.gpus} GPU(s) ({n.source})"))
    conn.execute(_INSERT, rows)
