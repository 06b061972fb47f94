"""Decisions and the cost guard's queries: history of succeeded attempts, committed GPU-hours,
decisions that move runs in the same transaction; and the cost view's one query (`cost_rows`)."""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, func, literal, null, select, union_all, update

from ..contracts.accounting import COST_GROUPS
from ..contracts.states import HELD, KIND_NOT_REPRODUCED, UNFINISHED_RUN_STATES
from ..errors import LedgerError
from .core import LedgerCore, NewRun, expect_rows
from .schema import (
    Attempt,
    Decision,
    Experiment,
    Run,
)

log = logging.getLogger(__name__)


class CostRow(NamedTuple):
    """One group of the cost view: GPU-hours booked (every attempt's, the scheduler's figure else the
    job's own), attempts, and GPU-hours decided not to spend (estimates of runs not reproduced, and
    of decisions made before an experiment had runs)."""

    key: str | None
    gpu_hours: float
    attempts: int
    decided_not_spent_gpu_hours: float


def _month(dialect: str, when: ColumnElement[Any]) -> ColumnElement[Any]:
    """YYYY-MM of a UTC time column: PostgreSQL's timestamptz in UTC; SQLite's text as stored."""
    if dialect == "postgresql":
        return func.to_char(func.timezone("UTC", when), "YYYY-MM")
    return func.substr(when, 1, 7)


class CostRecords(LedgerCore):
    """Decisions, what the cost guard reads, and the cost view (`cost_rows`)."""

    def record_decision(self, *, experiment_name: str, kind: str, actor: str, experiment_id: int | None = None,
                        **fields: Any) -> Decision:
        with self.session() as s:
            d = Decision(experiment_name=experiment_name, experiment_id=experiment_id, kind=kind, decided_by=actor,
                         **fields)
            s.add(d)
            s.flush()
            self._event(s, entity="decision", to_state=kind, actor=actor, reason=fields.get("reason"),
                        experiment_id=experiment_id, decision=d)
            return d

    def decisions(self, experiment_name: str | None = None) -> list[Decision]:
        with self.session() as s:
            q = select(Decision).order_by(Decision.id)
            if experiment_name is not None:
                q = q.where(Decision.experiment_name == experiment_name)
            return list(s.scalars(q))

    # -- cost guard: history, committed GPU-hours, decisions that move runs -------------------------

    def succeeded_attempts(self, *, method: str, gpus: int | None = None,
                           limit: int = 500) -> list[tuple[Experiment, Run, Attempt]]:
        """Succeeded attempts with an elapsed time, of runs of `method` (and `gpus`), newest first.

        The cost guard's history; the caller reads each run's result record (`run.result`).
        """
        with self.session() as s:
            q = (select(Experiment, Run, Attempt).join(Run, Run.experiment_id == Experiment.id)
                 .join(Attempt, Attempt.run_id == Run.id)
                 .where(Experiment.method == method, Attempt.state == "succeeded",
                        Attempt.elapsed_seconds.is_not(None))
                 .order_by(Attempt.id.desc()).limit(limit))
            if gpus is not None:
                q = q.where(Attempt.gpus == gpus)
            return [(e, r, a) for e, r, a in s.execute(q).all()]

    def committed_gpu_hours(self, *, user: str | None = None, queue: str | None = None,
                            experiment_id: int | None = None) -> tuple[float, float]:
        """(spent, in flight) GPU-hours of the experiments created by `user` and/or on `queue` (and/or
        of one experiment).

        Spent books each attempt's figure (the scheduler's, else the job's own); in flight is the
        estimate of every run still queued, submitted or running.
        """
        with self.session() as s:
            spent_q = (select(func.coalesce(func.sum(func.coalesce(Attempt.gpu_hours_scheduler,
                                                                       Attempt.gpu_hours_job)), 0.0))
                       .join(Run, Run.id == Attempt.run_id).join(Experiment, Experiment.id == Run.experiment_id))
            flight_q = (select(func.coalesce(func.sum(Run.estimated_gpu_hours), 0.0))
                        .join(Experiment, Experiment.id == Run.experiment_id)
                        .where(Run.state.in_(UNFINISHED_RUN_STATES)))
            if user is not None:
                spent_q = spent_q.where(Experiment.created_by == user)
                flight_q = flight_q.where(Experiment.created_by == user)
            if queue is not None:
                spent_q = spent_q.where(Experiment.queue == queue)
                flight_q = flight_q.where(Experiment.queue == queue)
            if experiment_id is not None:
                spent_q = spent_q.where(Experiment.id == experiment_id)
                flight_q = flight_q.where(Experiment.id == experiment_id)
            return float(s.scalar(spent_q) or 0.0), float(s.scalar(flight_q) or 0.0)

    def apply_decision(self, *, experiment_name: str, kind: str, actor: str, fields: Mapping[str, Any],
                       experiment_id: int | None = None, run_state: str | None = None,
                       new_experiment: Mapping[str, Any] | None = None,
                       new_runs: Sequence[NewRun] = (), hold: Collection[str] = ()) -> tuple[Decision, list[str]]:
        """Record a cost decision and move runs with it, in one transaction; returns (decision, moved run keys).

        `new_experiment` (create_experiment's keywords, without runs) creates the experiment with
        `new_runs` already in `not_reproduced`. `run_state="not_reproduced"` moves the experiment's
        queued and held runs there (runs that started already cost GPU-hours and are left alone);
        `run_state="queued"` puts its not_reproduced runs back in the queue (the cost was accepted),
        those of `hold` (a sequential design's later waves) back to held instead.
        """
        if run_state not in (None, "not_reproduced", "queued"):
            raise LedgerError(f"a decision moves runs to not_reproduced or queued, not {run_state!r}")
        why = fields.get("reason") or fields.get("resolution") or kind
        moved: list[str] = []
        with self.session() as s:
            if new_experiment is not None:
                exp, rows = self._create(s, **dict(new_experiment), actor=actor, runs=new_runs,
                                         states=["not_reproduced"] * len(new_runs), reason=why)
                experiment_id = exp.id
                if rows:
                    done = s.execute(update(Run).where(Run.id.in_(rows)).values(cause=why))
                    expect_rows(done, len(rows), f"deciding the runs of {experiment_name}")  # type: ignore[arg-type]
                moved = [nr.run_key for nr in new_runs]
            elif run_state is not None and experiment_id is not None:
                # held runs (a later wave) have spent nothing either: decided with the queued ones
                sources = ("queued", HELD) if run_state == "not_reproduced" else ("not_reproduced",)
                keys = list(s.scalars(select(Run.run_key).where(Run.experiment_id == experiment_id,
                                                                Run.state.in_(sources)).order_by(Run.id)))
                for key in keys:
                    run = self._locked_run(s, key)
                    if run.state not in sources:  # moved by someone else since the select
                        continue
                    self._move(s, run, HELD if run_state == "queued" and key in hold else run_state, actor, why)
                    run.cause = why if run_state == "not_reproduced" else None
                    moved.append(key)
            d = Decision(experiment_name=experiment_name, experiment_id=experiment_id, kind=kind, decided_by=actor,
                         **dict(fields))
            s.add(d)
            s.flush()
            self._event(s, entity="decision", to_state=kind, actor=actor, reason=why, experiment_id=experiment_id,
                        decision=d)
            log.info("decision %s on %s by %s; runs moved: %d", kind, experiment_name, actor, len(moved))
            return d, moved

    def cost_rows(self, by: str, *, since: datetime | None = None, default_queue: str) -> list[CostRow]:
        """The cost view grouped `by` user (who created the experiment: who is charged), experiment
        (name, all versions), queue or month (when each was booked), from `since` on: ONE query, a
        UNION ALL of attempts, runs decided not reproduced and decisions without runs, grouped once.
        `--since` reads attempts through `ix_attempts_booked_at`."""
        if by not in COST_GROUPS:
            raise LedgerError(f"costs are grouped by {', '.join(COST_GROUPS)}, not {by!r}")
        att, run, exp, dec = Attempt.__table__.c, Run.__table__.c, Experiment.__table__.c, Decision.__table__.c
        dialect = self.engine.dialect.name
        booked_at = func.coalesce(att.ended_at, att.created_at)  # the expression of ix_attempts_booked_at
        keys = {"user": (exp.created_by, exp.created_by, dec.decided_by),
                "experiment": (exp.name, exp.name, dec.experiment_name),
                "queue": (func.coalesce(exp.queue, default_queue),) * 2 + (null(),),
                "month": (_month(dialect, booked_at), _month(dialect, run.updated_at), _month(dialect, dec.decided_at))}[by]
        zero, none = literal(0.0), literal(0)
        spent = (select(keys[0].label("key"), func.coalesce(att.gpu_hours_scheduler, att.gpu_hours_job, 0.0).label("gpu"),
                        literal(1).label("n"), zero.label("decided"))
                 .select_from(Attempt.__table__.join(Run.__table__, run.id == att.run_id)
                              .join(Experiment.__table__, exp.id == run.experiment_id)))
        decided = (select(keys[1], zero, none, func.coalesce(run.estimated_gpu_hours, 0.0))
                   .select_from(Run.__table__.join(Experiment.__table__, exp.id == run.experiment_id))
                   .where(run.state == "not_reproduced"))
        before = (select(keys[2], zero, none, func.coalesce(dec.estimated_gpu_hours, 0.0))
                  .where(dec.experiment_id.is_(None), dec.kind == KIND_NOT_REPRODUCED))
        if since is not None:
            spent, decided, before = (spent.where(booked_at >= since), decided.where(run.updated_at >= since),
                                      before.where(dec.decided_at >= since))
        parts = union_all(spent, decided, before).subquery()
        query = (select(parts.c.key, func.sum(parts.c.gpu), func.sum(parts.c.n), func.sum(parts.c.decided))
                 .group_by(parts.c.key).order_by(parts.c.key))
        with self.reading() as conn:
            return [CostRow(k, float(g or 0.0), int(n or 0), float(d or 0.0)) for k, g, n, d in conn.execute(query)]
