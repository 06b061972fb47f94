"""The looks of sequential designs (schema.SequentialLook, migration 0012): recorded by reconcile
(ggpo_batch/control/waves.py), one transaction per look over the arms, read back by the report,
`advise` and an audit; and the experiments that may be due a look, found in one query per cycle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import exists, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import aliased

from ..contracts.states import HELD, KIND_COST_ACCEPTED, RECORD_RUN_STATES
from .core import LedgerCore
from .read_only import write_refused
from .schema import Decision, Experiment, Run, SequentialLook, utcnow

# A look's decisions (control/waves.py owns what each does).
LOOK_DECISIONS = ("crossed", "futile", "continue", "final", "refused")
IN_FLIGHT_RUN_STATES = ("queued", "submitted", "running")
LOOK_FIELDS = ("arm", "look", "looks", "seeds", "seeds_paired", "metric", "statistic", "boundary", "alpha",
               "spending", "waves", "per_seed", "decision", "reason")


def _due_query() -> Any:
    """Experiment versions of a spec with nothing queued or running, a run that ended, and either a
    held run or an arm whose latest look said continue (or refused, and the cost was accepted since):
    a wave has ended, or its look's moves are still to do."""
    r, e, lk = Run.__table__.c, Experiment.__table__.c, SequentialLook.__table__.c
    later = aliased(SequentialLook.__table__)
    in_flight = exists().where(r.experiment_id == e.id, r.state.in_(IN_FLIGHT_RUN_STATES))
    ended = exists().where(r.experiment_id == e.id, r.state.in_(sorted(RECORD_RUN_STATES)))
    held = exists().where(r.experiment_id == e.id, r.state == HELD)
    d = Decision.__table__.c
    accepted = exists().where(d.experiment_id == e.id, d.kind == KIND_COST_ACCEPTED, d.decided_at > lk.decided_at)
    open_look = exists().where(lk.experiment_id == e.id,
                               (lk.decision == "continue") | ((lk.decision == "refused") & accepted),
                               ~exists().where(later.c.experiment_id == lk.experiment_id, later.c.arm == lk.arm,
                                               later.c.look > lk.look))
    return (select(e.id, e.name, e.version).where(e.source == "spec", ~in_flight, ended, held | open_look)
            .order_by(e.id))


_DUE = _due_query()


class LookRecords(LedgerCore):
    """Record and read the looks of sequential designs."""

    def looks_due(self) -> list[tuple[int, str, int]]:
        """(experiment id, name, version) of the versions a look (or a look's moves) may be due on."""
        with self.reading() as conn:
            return [(int(i), str(n), int(v)) for i, n, v in conn.execute(_DUE)]

    def record_looks(self, experiment_id: int, looks: Sequence[Mapping[str, Any]], *, actor: str) -> None:
        """Book one look's rows (one per arm; `LOOK_FIELDS`) in one transaction. A look already
        recorded for an arm (another reconciler's) makes the whole call fail on the unique key."""
        if not looks:
            return
        now = utcnow()
        rows = []
        for lk in looks:
            if lk["decision"] not in LOOK_DECISIONS:
                raise ValueError(f"look decision {lk['decision']!r}: one of {', '.join(LOOK_DECISIONS)}")
            rows.append({**{k: lk.get(k) for k in LOOK_FIELDS}, "experiment_id": experiment_id,
                         "decided_by": actor, "decided_at": now})
        try:
            with self.transaction() as conn:
                conn.execute(insert(SequentialLook.__table__), rows)
        except DBAPIError as exc:  # a member's reconcile: only the service records looks (migration 0012)
            refused = write_refused(exc)
            if refused is not None:
                raise refused from None
            raise

    def looks(self, experiment_id: int) -> list[dict[str, Any]]:
        """Every look recorded on an experiment version, in look then arm order, as plain dicts."""
        t = SequentialLook.__table__
        with self.reading() as conn:
            rows = conn.execute(select(t).where(t.c.experiment_id == experiment_id).order_by(t.c.look, t.c.arm))
            return [{k: v for k, v in row._mapping.items() if k != "experiment_id"} for row in rows]
