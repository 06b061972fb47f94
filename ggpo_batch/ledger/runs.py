"""Experiments and runs in the ledger: creating them, reading them, and the run transitions
that are not about one attempt (requeue, release of held runs, cancel, not reproduced). The other parts of `Ledger`
are attempts.py, costs.py and component_runs.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, insert, literal, null, select
from sqlalchemy.orm import Session, undefer

from ..contracts.states import HELD, IN_FLIGHT_ATTEMPT_STATES, UNFINISHED_RUN_STATES
from ..errors import LedgerError
from .bulk import insert_rows
from .core import LedgerCore, NewRun
from .schema import (
    Attempt,
    Event,
    Experiment,
    Run,
    utcnow,
)

_RUN_COLUMNS = ("experiment_id", "run_key", "arm", "seed", "state", "config_hash", "run_spec", "retries_allowed",
                "estimated_gpu_hours", "priority")


class RunTransitions(LedgerCore):
    """Experiments and runs: create, import, read, requeue, cancel, not reproduced."""

    def latest_experiment(self, name: str) -> Experiment | None:
        with self.session() as s:
            return s.scalars(
                select(Experiment).options(undefer(Experiment.spec)).where(Experiment.name == name)
                .order_by(Experiment.version.desc()).limit(1)
            ).one_or_none()

    def experiment_spec(self, experiment_id: int) -> dict[str, Any]:
        """One experiment version's canonical spec (the deferred column: read only where asked)."""
        with self.session() as s:
            spec = s.scalar(select(Experiment.spec).where(Experiment.id == experiment_id))
            return dict(spec) if isinstance(spec, Mapping) else {}

    def run_states(self, experiment_id: int) -> dict[str, str]:
        """Run key -> state for one experiment version (cheap: no JSON columns)."""
        with self.session() as s:
            return dict(s.execute(select(Run.run_key, Run.state).where(Run.experiment_id == experiment_id)).all())

    def outcomes(self, experiment_id: int) -> dict[int, dict[str, Any]]:
        """Run id -> evaluation outcome of one experiment version's runs that have one (the deferred
        column, read only here: the report's)."""
        with self.session() as s:
            rows = s.execute(select(Run.id, Run.outcome).where(Run.experiment_id == experiment_id,
                                                               Run.outcome.is_not(None)))
            return {i: o for i, o in rows if o is not None}

    def create_experiment(self, *, name: str, version: int, method: str, source: str, spec_hash: str,
                          spec: Mapping[str, Any], gpus: int, actor: str, runs: Sequence[NewRun],
                          initial_state: str = "queued", states: Sequence[str] | None = None,
                          source_path: str | None = None, queue: str | None = None,
                          max_gpu_hours: float | None = None, reason: str | None = None) -> Experiment:
        """Create an experiment version with its runs, all in `initial_state` (or each in its own of
        `states`, in `runs` order: `held` for those a canary or an earlier wave holds), in one transaction."""
        states = list(states) if states is not None else [initial_state] * len(runs)
        if len(states) != len(runs):
            raise LedgerError(f"{len(runs)} run(s) but {len(states)} state(s)")
        with self.session() as s:
            exp, _ = self._create(s, name=name, version=version, method=method, source=source, spec_hash=spec_hash,
                                  spec=spec, gpus=gpus, actor=actor, runs=runs, states=states,
                                  source_path=source_path, queue=queue, max_gpu_hours=max_gpu_hours, reason=reason,
                                  ids=False)
            return exp

    def add_runs(self, experiment_id: int, runs: Sequence[NewRun], *, actor: str, state: str = "queued",
                 reason: str | None = None, states: Sequence[str] | None = None) -> list[int]:
        """Add runs to an existing experiment version (e.g. arms first enqueued with --arms), all in
        `state` or each in its own of `states`."""
        states = list(states) if states is not None else [state] * len(runs)
        if len(states) != len(runs):
            raise LedgerError(f"{len(runs)} run(s) but {len(states)} state(s)")
        with self.session() as s:
            return self._insert_runs(s, experiment_id, runs, states, actor=actor, reason=reason)

    def _insert_runs(self, s: Session, experiment_id: int, runs: Sequence[NewRun], states: Sequence[str], *,
                     actor: str, reason: str | None, ids: bool = True,
                     results: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Insert runs and their first events; returns the runs' ids in `runs` order (with `ids`;
        reading them back is a fifth of the time of 10,000 runs on PostgreSQL, so an enqueue,
        which does not need them, skips it and gets []).

        The runs go in through the driver's bulk path (`bulk.insert_rows`: COPY / executemany),
        and their events as ONE `INSERT ... SELECT` over the rows just written: this call's
        experiment and timestamp (enqueue holds the ledger's lock; an import makes its own
        experiment). 10,000 runs: about 0.15 s on SQLite."""
        if not runs:
            return []
        now = utcnow()
        rows = ((experiment_id, nr.run_key, nr.arm, nr.seed, st, nr.config_hash, nr.run_spec, nr.retries_allowed,
                 nr.estimated_gpu_hours, nr.priority) for nr, st in zip(runs, states))
        if results is None:
            insert_rows(s, Run.__table__, _RUN_COLUMNS, rows, constants={"created_at": now, "updated_at": now})
        else:  # a JSON column given None would store JSON null, not NULL: only where there are results
            insert_rows(s, Run.__table__, (*_RUN_COLUMNS, "result"),
                        ((*row, dict(res)) for row, res in zip(rows, results)),
                        constants={"created_at": now, "updated_at": now})
        these = (Run.experiment_id == experiment_id) & (Run.created_at == now)
        at = literal(now, type_=Event.__table__.c.at.type)
        s.connection().execute(insert(Event.__table__).from_select(
            ["at", "experiment_id", "run_id", "entity", "from_state", "to_state", "actor", "reason"],
            select(at, Run.experiment_id, Run.id, literal("run"), null(), Run.state, literal(actor),
                   literal(reason, type_=Event.__table__.c.reason.type)).where(these).order_by(Run.id)))
        if not ids:
            return []
        by_key = {key: i for key, i in s.connection().execute(select(Run.run_key, Run.id).where(these))}
        return [by_key[nr.run_key] for nr in runs]

    def import_finished(self, *, name: str, version: int, method: str, spec_hash: str, spec: Mapping[str, Any],
                        gpus: int, actor: str, source_path: str, runs: Sequence[NewRun],
                        outcomes: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> Experiment:
        """Create an experiment whose runs already ran elsewhere: per run (state, result, attempt fields).

        All or nothing: one transaction, so a bad record leaves no half-imported experiment.
        """
        reason = f"imported from {source_path}"
        with self.session() as s:
            exp, rows = self._create(s, name=name, version=version, method=method, source="import",
                                     spec_hash=spec_hash, spec=spec, gpus=gpus, actor=actor, runs=runs,
                                     states=[o[0] for o in outcomes], source_path=source_path, reason=reason,
                                     results=[o[1] for o in outcomes])
            for run_id, (state, _result, fields) in zip(rows, outcomes):
                run = s.get(Run, run_id)
                assert run is not None
                att = Attempt(run_id=run.id, number=1, executor="import", state=state, submitted_by=actor,
                              **dict(fields))
                s.add(att)
                s.flush()
                self._event(s, entity="attempt", to_state=state, actor=actor, reason=reason, run=run, attempt=att)
            return exp

    def _create(self, s: Session, *, name: str, version: int, method: str, source: str, spec_hash: str,
                spec: Mapping[str, Any], gpus: int, actor: str, runs: Sequence[NewRun], states: Sequence[str],
                source_path: str | None = None, queue: str | None = None, max_gpu_hours: float | None = None,
                reason: str | None = None, ids: bool = True,
                results: Sequence[Mapping[str, Any]] | None = None) -> tuple[Experiment, list[int]]:
        exp = Experiment(name=name, version=version, method=method, source=source, source_path=source_path,
                         spec_hash=spec_hash, spec=dict(spec), queue=queue, gpus=gpus,
                         max_gpu_hours=max_gpu_hours, created_by=actor)
        s.add(exp)
        s.flush()
        self._event(s, entity="experiment", to_state="created", actor=actor, reason=reason, experiment_id=exp.id)
        rows = self._insert_runs(s, exp.id, runs, states, actor=actor, reason=reason, ids=ids, results=results)
        return exp, rows

    def get_run(self, run_key: str) -> Run:
        with self.session() as s:
            run = s.scalars(select(Run).where(Run.run_key == run_key)).one_or_none()
            if run is None:
                raise LedgerError(f"no run {run_key!r} in the ledger")
            return run

    def submission_view(self, run_key: str) -> tuple[str, dict[str, Any], str | None]:
        """(state, run spec, experiment's queue) of a run: what a worker needs to decide whether and
        how to submit it, in one Core query (no attempts, no ORM objects)."""
        runs, exps = Run.__table__.c, Experiment.__table__.c
        with self.session() as s:
            row = s.connection().execute(select(runs.state, runs.run_spec, exps.queue)
                                         .join_from(Run.__table__, Experiment.__table__, exps.id == runs.experiment_id)
                                         .where(runs.run_key == run_key)).one_or_none()
        if row is None:
            raise LedgerError(f"no run {run_key!r} in the ledger")
        return row[0], row[1], row[2]

    def experiments(self, name: str | None = None) -> list[Experiment]:
        with self.session() as s:
            q = select(Experiment).order_by(Experiment.name, Experiment.version)
            if name is not None:
                q = q.where(Experiment.name == name)
            return list(s.scalars(q))

    def runs(self, *, experiment_id: int | None = None, states: Iterable[str] | None = None,
             with_attempts: bool = True) -> list[Run]:
        from sqlalchemy.orm import selectinload

        with self.session() as s:
            q = select(Run).order_by(Run.experiment_id, Run.arm, Run.seed)
            if with_attempts:
                q = q.options(selectinload(Run.attempts))
            if experiment_id is not None:
                q = q.where(Run.experiment_id == experiment_id)
            if states is not None:
                q = q.where(Run.state.in_(list(states)))
            return list(s.scalars(q))

    def queued_run_keys(self, queue: str, *, default_queue: str) -> dict[str, str]:
        """Key -> priority of the runs queued in the ledger on `queue` (an experiment without a queue
        of its own is on `default_queue`), leaving out those whose attempt is being submitted right
        now. Two columns of one query: reconcile compares the keys with Redis' id lists, at any
        backlog, and puts a missing run back on its priority's queue."""
        with self.session() as s:
            exps = list(s.scalars(select(Experiment.id).where(func.coalesce(Experiment.queue, default_queue) == queue)))
            if not exps:
                return {}
            busy = set(s.scalars(select(Run.run_key).join(Attempt, Attempt.run_id == Run.id)
                                 .where(Attempt.state == "submitting")))
            runs = Run.__table__.c  # Core rows, not ORM entities: 100,000 keys in a fraction of the time
            rows = s.connection().execute(select(runs.run_key, runs.priority).where(runs.state == "queued",
                                                                                   runs.experiment_id.in_(exps)))
            return {key: priority for key, priority in rows if key not in busy}

    def queued_executors(self, queues: Iterable[str], *, default_queue: str) -> set[str]:
        """The executors named by the runs queued on these queues."""
        ex = Run.run_spec["executor"].as_string()
        with self.session() as s:
            q = (select(ex).distinct().join(Experiment, Experiment.id == Run.experiment_id)
                 .where(Run.state == "queued", func.coalesce(Experiment.queue, default_queue).in_(list(queues))))
            return {e for e in s.scalars(q) if e}

    def count_queued(self, queues: Iterable[str], *, default_queue: str) -> int:
        """How many runs are queued in the ledger on these queues."""
        with self.session() as s:
            q = (select(func.count()).select_from(Run).join(Experiment, Experiment.id == Run.experiment_id)
                 .where(Run.state == "queued", func.coalesce(Experiment.queue, default_queue).in_(list(queues))))
            return int(s.scalar(q) or 0)

    def events(self, *, run_key: str | None = None, experiment_id: int | None = None) -> list[Event]:
        with self.session() as s:
            q = select(Event).order_by(Event.id)
            if run_key is not None:
                q = q.join(Run, Run.id == Event.run_id).where(Run.run_key == run_key)
            if experiment_id is not None:
                q = q.where(Event.experiment_id == experiment_id)
            return list(s.scalars(q))

    # -- run transitions --------------------------------------------------------------------

    def requeue(self, run_key: str, *, actor: str, reason: str) -> Run:
        """Back to queued: a manual retry, accepted cost, infrastructure retry, or a deferral."""
        with self.session() as s:
            run = self._locked_run(s, run_key)
            if run.state == "queued":
                self._event(s, entity="run", from_state="queued", to_state="queued", actor=actor, reason=reason,
                            run=run)
                return run
            self._move(s, run, "queued", actor, reason)
            run.cause = None
            run.worker = None
            return run

    def release_held(self, experiment_id: int, *, actor: str, reason: str,
                     run_keys: Iterable[str] | None = None) -> dict[str, str]:
        """Held -> queued, in one transaction, for the experiment version's held runs (or those of
        `run_keys`); returns key -> priority of those moved, for the caller to put on the queue
        (control/holds.py: the ledger first, then Redis). A run no longer held is left alone."""
        with self.session() as s:
            q = select(Run.run_key).where(Run.experiment_id == experiment_id, Run.state == HELD).order_by(Run.id)
            if run_keys is not None:
                q = q.where(Run.run_key.in_(list(run_keys)))
            moved: dict[str, str] = {}
            for key in list(s.scalars(q)):
                run = self._locked_run(s, key)
                if run.state != HELD:  # moved by someone else since the select
                    continue
                self._move(s, run, "queued", actor, reason)
                moved[key] = run.priority
            return moved

    def mark_cancelled(self, run_key: str, *, actor: str, reason: str | None = None) -> Run:
        """The run is cancelled now; its scheduler jobs (if any) are cancelled by the caller."""
        with self.session() as s:
            run = self._locked_run(s, run_key)
            self._move(s, run, "cancelled", actor, reason)
            # An attempt with a job id stays open: reconcile books its end and GPU-hours from the
            # scheduler once the cancellation has taken effect.
            for att in run.attempts:
                if att.state == "submitting":
                    self._event(s, entity="attempt", from_state=att.state, to_state="cancelled", actor=actor,
                                reason=reason, run=run, attempt=att)
                    att.state, att.ended_at = "cancelled", utcnow()
            run.cause = reason
            return run

    def clean_run(self, run_key: str, *, actor: str, remove: Callable[[Run], str | None]) -> str | None:
        """Remove files of a finished run with the run locked, and book what went as an event
        (entity `cleanup`): `remove(run)` deletes them and says what it removed (None: nothing).
        A run that is not finished, or has an attempt that may still hold an allocation (a cancelled
        run's job not yet ended), is left alone: returns None without calling `remove`."""
        with self.session() as s:
            run = self._locked_run(s, run_key)
            if run.state in UNFINISHED_RUN_STATES or any(a.state in IN_FLIGHT_ATTEMPT_STATES for a in run.attempts):
                return None
            removed = remove(run)
            if removed:
                self._event(s, entity="cleanup", to_state="removed", actor=actor, reason=removed, run=run)
            return removed

    def mark_not_reproduced(self, run_key: str, *, actor: str, reason: str) -> Run:
        with self.session() as s:
            run = self._locked_run(s, run_key)
            self._move(s, run, "not_reproduced", actor, reason)
            run.cause = reason
            return run
