"""What `status` reads: per-arm totals computed in SQL, and the runs worth showing, fetched a
bounded page at a time. Nothing here loads every run of an experiment, so `status` costs about
the same at 100,000 runs as at 1,000."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import case, exists, func, select
from sqlalchemy.orm import selectinload

from ..contracts.accounting import disagrees_clause
from ..contracts.run_record import BUDGET_STATUS_RECONCILED, TRAINING_STATUS_VALIDATED
from ..contracts.states import RECORD_RUN_STATES
from .core import LedgerCore
from .heartbeats import HUNG_SINCE
from .schema import Attempt, Run

# The record's stamps, read in SQL (both backends extract JSON paths through SQLAlchemy's JSON type).
_TRAINING_STATUS = Run.result["training"]["status"].as_string()
_BUDGET_STATUS = Run.result["budget"]["status"].as_string()
_STEPS = Run.result["training"]["counts"]["steps"].as_integer()
AUDIT_FAILED = _TRAINING_STATUS.is_not(None) & (_TRAINING_STATUS != TRAINING_STATUS_VALIDATED)
BUDGET_SHORT = _BUDGET_STATUS.is_not(None) & (_BUDGET_STATUS != BUDGET_STATUS_RECONCILED)
DISAGREEMENT = exists().where(Attempt.run_id == Run.id,
                              disagrees_clause(Attempt.gpu_hours_job, Attempt.gpu_hours_scheduler))


@dataclass
class ArmTotals:
    """One (experiment, arm, run state) cell of the totals."""

    experiment_id: int
    arm: str
    state: str
    runs: int = 0
    attempts: int = 0
    steps: int = 0
    allocated_gpu_hours: float = 0.0
    estimated_gpu_hours: float | None = None
    audit_failed: int = 0
    budget_not_reconciled: int = 0


class RunSummaries(LedgerCore):
    """Status reads: totals by (experiment, arm, state) and bounded pages of runs."""

    def arm_totals(self, experiment_ids: Sequence[int], *, states: Iterable[str] | None = None) -> list[ArmTotals]:
        """Totals per (experiment, arm, state) over the runs in `states` (all if None), in three
        GROUP BY queries: run counts and estimates from the `ix_runs_status_totals` index alone;
        the record's figures (steps, stamps) from finished runs only, the only ones with a record;
        attempts through their own index. A backlog of queued runs is never read row by row."""
        if not experiment_ids:
            return []
        keys = (Run.experiment_id, Run.arm, Run.state)
        where = [Run.experiment_id.in_(list(experiment_ids))]
        if states is not None:
            where.append(Run.state.in_(list(states)))
        cells: dict[tuple[int, str, str], ArmTotals] = {}
        with self.session() as s:
            for e, arm, st, n, est in s.execute(select(*keys, func.count(), func.sum(Run.estimated_gpu_hours))
                                                .where(*where).group_by(*keys)):
                cells[(e, arm, st)] = ArmTotals(e, arm, st, runs=n, estimated_gpu_hours=est)
            finished = [st for (_, _, st) in cells if st in RECORD_RUN_STATES]
            if finished:
                figures = (select(*keys, func.sum(_STEPS), func.sum(case((AUDIT_FAILED, 1), else_=0)),
                                  func.sum(case((BUDGET_SHORT, 1), else_=0)))
                           .where(*where, Run.state.in_(sorted(set(finished)))).group_by(*keys))
                for e, arm, st, steps, failed, short in s.execute(figures):
                    cell = cells[(e, arm, st)]
                    cell.steps, cell.audit_failed, cell.budget_not_reconciled = (int(steps or 0), int(failed or 0),
                                                                                 int(short or 0))
            cost = func.coalesce(Attempt.gpu_hours_scheduler, Attempt.gpu_hours_job)
            att_q = (select(*keys, func.count(Attempt.id), func.sum(cost)).join(Attempt, Attempt.run_id == Run.id)
                     .where(*where).group_by(*keys))
            for e, arm, st, n, gh in s.execute(att_q):
                cell = cells.setdefault((e, arm, st), ArmTotals(e, arm, st))
                cell.attempts, cell.allocated_gpu_hours = n, float(gh or 0.0)
        return sorted(cells.values(), key=lambda c: (c.experiment_id, c.arm, c.state))

    def status_runs(self, experiment_id: int, *, states: Iterable[str] | None = None, attention: bool = False,
                    limit: int | None = None) -> Iterator[Run]:
        """Runs of one experiment with their attempts and provenances, `limit` at most. With `attention`, only those
        that need a look (unfinished, failed, lost, flagged), the worst first; page by page, so a
        listing of every run never holds them all in memory."""
        wanted = list(states) if states is not None else None
        with self.session() as s:
            if not attention:
                q = self._runs_query(experiment_id, wanted).order_by(Run.arm, Run.seed)
                yield from self._paged(s, q, limit)
                return
            left = limit
            for group in _ATTENTION_ORDER:
                st = [x for x in group if wanted is None or x in wanted]
                if not st or left == 0:
                    continue
                q = self._runs_query(experiment_id, st).order_by(*_group_order(group))
                for run in self._paged(s, q, left):
                    yield run
                    left = None if left is None else left - 1
            if left != 0 and (wanted is None or "succeeded" in wanted):
                q = (self._runs_query(experiment_id, ["succeeded"])
                     .where(AUDIT_FAILED | BUDGET_SHORT | DISAGREEMENT).order_by(Run.id))
                yield from self._paged(s, q, left)

    def flagged_count(self, experiment_id: int, *, states: Iterable[str] | None = None) -> int:
        """Succeeded runs of an experiment that are flagged (audit failed, budget short, GPU-hour
        figures disagreeing): with the unfinished, failed and lost ones, what `status` lists."""
        if states is not None and "succeeded" not in set(states):
            return 0
        with self.session() as s:
            return int(s.scalar(select(func.count(Run.id)).where(
                Run.experiment_id == experiment_id, Run.state == "succeeded",
                AUDIT_FAILED | BUDGET_SHORT | DISAGREEMENT)) or 0)

    @staticmethod
    def _runs_query(experiment_id: int, states: list[str] | None):  # type: ignore[no-untyped-def]
        q = select(Run).where(Run.experiment_id == experiment_id).options(selectinload(Run.attempts),
                                                                           selectinload(Run.provenances))
        return q.where(Run.state.in_(states)) if states is not None else q

    @staticmethod
    def _paged(s, q, limit: int | None, page: int = 500) -> Iterator[Run]:  # type: ignore[no-untyped-def]
        if limit is not None:
            yield from s.scalars(q.limit(limit)).unique()
            return
        offset = 0
        while True:  # keyset-free paging keeps memory flat for a listing of every run
            rows = list(s.scalars(q.limit(page).offset(offset)).unique())
            yield from rows
            if len(rows) < page:
                return
            offset += page
            s.expunge_all()


# The order attention runs are shown in: what went wrong first, then what is in flight (the running
# run silent the longest first: a hung job leads), then waiting, then held off the queue.
_ATTENTION_ORDER = (("failed", "lost", "timeout"), ("running",), ("submitted",), ("queued",), ("held",))


def _group_order(group: tuple[str, ...]) -> tuple:  # type: ignore[type-arg]
    if group != ("running",):
        return (Run.id,)
    silent_since = (select(func.min(HUNG_SINCE)).where(Attempt.run_id == Run.id, Attempt.state == "running")
                    .correlate(Run).scalar_subquery())
    return (silent_since.asc().nulls_last(), Run.id)
