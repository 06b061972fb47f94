"""Ledger transitions: the only code that writes run and attempt state.

Each transition runs in one transaction, locks the row it changes, checks the move is allowed,
and appends an `events` row (who, when, from, to, why) in that same transaction.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker, undefer

from ..errors import LedgerError
from .schema import (
    ACTIVE_RUN_STATES,
    Artifact,
    Attempt,
    ComponentRun,
    Decision,
    Event,
    Experiment,
    Run,
    utcnow,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_PROCESS_LOCKS: dict[str, threading.Lock] = {}

# Allowed run transitions. Leaving a final state (back to queued) always needs a reason:
# a manual retry, an accepted cost, or an infrastructure retry the spec allows.
_RUN_MOVES: dict[str | None, frozenset[str]] = {
    None: frozenset({"queued", "not_reproduced", "succeeded", "failed", "timeout", "cancelled", "lost"}),
    "queued": frozenset({"submitted", "cancelled", "not_reproduced", "lost"}),
    "submitted": frozenset({"running", "succeeded", "failed", "timeout", "cancelled", "lost", "queued"}),
    "running": frozenset({"succeeded", "failed", "timeout", "cancelled", "lost", "queued"}),
    "failed": frozenset({"queued"}),
    "timeout": frozenset({"queued"}),
    "lost": frozenset({"queued"}),
    "cancelled": frozenset({"queued"}),
    "not_reproduced": frozenset({"queued"}),
    "succeeded": frozenset(),
}
ATTEMPT_FINAL = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost", "preempted", "node_fail"})


@dataclass(frozen=True)
class NewRun:
    """A run to add to an experiment."""

    run_key: str
    arm: str
    seed: int
    config_hash: str
    run_spec: Mapping[str, Any]
    retries_allowed: int = 0
    estimated_gpu_hours: float | None = None


class QuotaExceeded(LedgerError):
    """Submitting would put a queue over its GPU quota; the run stays queued (deferred)."""

    def __init__(self, queue: str, used: int, gpus: int, limit: int) -> None:
        super().__init__(f"queue {queue}: {used} GPUs in flight + {gpus} > quota {limit}")
        self.queue, self.used, self.gpus, self.limit = queue, used, gpus, limit


def _retrying(method: Callable[..., T]) -> Callable[..., T]:
    """Re-run a whole ledger call while the database is unreachable (PostgreSQL restarting, SQLite
    locked), with exponential backoff up to the ledger's `retry_seconds`; each call is one
    transaction, so a retry repeats it from the start and never half-applies it."""

    @functools.wraps(method)
    def wrapper(self: "Ledger", *args: Any, **kwargs: Any) -> T:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.25
        while True:
            try:
                return method(self, *args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                first = str(exc.orig).splitlines()[0] if getattr(exc, "orig", None) else type(exc).__name__
                log.warning("ledger unavailable (%s); retrying %s in %.1f s", first, method.__name__, min(delay, left))
                time.sleep(min(delay, left))
                delay = min(delay * 2, 5.0)

    return wrapper


class Ledger:
    """The ledger on one database. Cheap to create; holds only an engine.

    Every public method is one transaction and is retried while the database is unreachable,
    for at most `retry_seconds` (default 120: a PostgreSQL restart does not lose a transition).
    """

    def __init__(self, engine: Engine, *, retry_seconds: float = 120.0) -> None:
        self.engine = engine
        self.retry_seconds = retry_seconds
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:  # pragma: no cover - no subclasses today
        super().__init_subclass__(**kwargs)
        _wrap_public(cls)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error."""
        with self._sessions() as s, s.begin():
            yield s

    @contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold a lock named `name` across processes for a check-then-write that spans several
        transactions (the cost caps: two enqueues must not both fit under the same cap).

        PostgreSQL: a session advisory lock on a connection of its own. SQLite: an flock on a file
        beside the database (SQLite is one machine), or a process lock for an in-memory database.
        """
        if self.engine.dialect.name == "postgresql":
            key = func.hashtext(f"ggpo:{name}")
            with self.engine.connect() as conn:
                conn.execute(select(func.pg_advisory_lock(key)))
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(select(func.pg_advisory_unlock(key)))
                    conn.commit()
            return
        path = self.engine.url.database
        if not path or path == ":memory:":
            with _PROCESS_LOCKS.setdefault(name, threading.Lock()):
                yield
            return
        with open(f"{path}.{name}.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- internal helpers -------------------------------------------------------------------

    @staticmethod
    def _event(s: Session, *, entity: str, to_state: str, actor: str, from_state: str | None = None,
               reason: str | None = None, experiment_id: int | None = None, run: Run | None = None,
               attempt: Attempt | None = None) -> None:
        s.add(Event(
            entity=entity, from_state=from_state, to_state=to_state, actor=actor, reason=reason,
            experiment_id=experiment_id if experiment_id is not None else (run.experiment_id if run else None),
            run_id=run.id if run else None, attempt_id=attempt.id if attempt else None,
        ))

    @staticmethod
    def _locked_run(s: Session, run_key: str) -> Run:
        run = s.scalars(select(Run).where(Run.run_key == run_key).with_for_update(of=Run)).unique().one_or_none()
        if run is None:
            raise LedgerError(f"no run {run_key!r} in the ledger")
        return run

    def _move(self, s: Session, run: Run, to: str, actor: str, reason: str | None,
              attempt: Attempt | None = None) -> None:
        if to not in _RUN_MOVES[run.state]:
            raise LedgerError(f"run {run.run_key}: cannot go from {run.state} to {to}")
        if run.state in ("failed", "timeout", "lost", "cancelled", "not_reproduced") and not reason:
            raise LedgerError(f"run {run.run_key}: leaving {run.state} needs a reason")
        self._event(s, entity="run", from_state=run.state, to_state=to, actor=actor, reason=reason, run=run,
                    attempt=attempt)
        run.state = to
        run.updated_at = utcnow()

    # -- experiments and runs ---------------------------------------------------------------

    def latest_experiment(self, name: str) -> Experiment | None:
        with self.session() as s:
            return s.scalars(
                select(Experiment).options(undefer(Experiment.spec)).where(Experiment.name == name)
                .order_by(Experiment.version.desc()).limit(1)
            ).one_or_none()

    def run_states(self, experiment_id: int) -> dict[str, str]:
        """Run key -> state for one experiment version (cheap: no JSON columns)."""
        with self.session() as s:
            return dict(s.execute(select(Run.run_key, Run.state).where(Run.experiment_id == experiment_id)).all())

    def create_experiment(self, *, name: str, version: int, method: str, source: str, spec_hash: str,
                          spec: Mapping[str, Any], gpus: int, actor: str, runs: Sequence[NewRun],
                          initial_state: str = "queued", source_path: str | None = None,
                          queue: str | None = None, max_gpu_hours: float | None = None,
                          reason: str | None = None) -> Experiment:
        """Create an experiment version with its runs, all in `initial_state`, in one transaction."""
        with self.session() as s:
            exp, _ = self._create(s, name=name, version=version, method=method, source=source, spec_hash=spec_hash,
                                  spec=spec, gpus=gpus, actor=actor, runs=runs, states=[initial_state] * len(runs),
                                  source_path=source_path, queue=queue, max_gpu_hours=max_gpu_hours, reason=reason)
            return exp

    def add_runs(self, experiment_id: int, runs: Sequence[NewRun], *, actor: str, state: str = "queued",
                 reason: str | None = None) -> list[int]:
        """Add runs to an existing experiment version (e.g. arms first enqueued with --arms)."""
        with self.session() as s:
            return self._insert_runs(s, experiment_id, runs, [state] * len(runs), actor=actor, reason=reason)

    def _insert_runs(self, s: Session, experiment_id: int, runs: Sequence[NewRun], states: Sequence[str], *,
                     actor: str, reason: str | None) -> list[int]:
        """Bulk INSERT ... RETURNING for runs and their first events: 10,000 runs in well under a second."""
        if not runs:
            return []
        now = utcnow()
        params = [dict(experiment_id=experiment_id, run_key=nr.run_key, arm=nr.arm, seed=nr.seed, state=st,
                       config_hash=nr.config_hash, run_spec=dict(nr.run_spec), retries_allowed=nr.retries_allowed,
                       estimated_gpu_hours=nr.estimated_gpu_hours, created_at=now, updated_at=now)
                  for nr, st in zip(runs, states)]
        rows = s.execute(insert(Run).returning(Run.id, Run.state, sort_by_parameter_order=True), params).all()
        s.execute(insert(Event), [dict(at=now, experiment_id=experiment_id, run_id=i, entity="run", from_state=None,
                                       to_state=st, actor=actor, reason=reason) for i, st in rows])
        return [i for i, _ in rows]

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
                                     states=[o[0] for o in outcomes], source_path=source_path, reason=reason)
            for run_id, (state, result, fields) in zip(rows, outcomes):
                run = s.get(Run, run_id)
                assert run is not None
                run.result = dict(result)
                att = Attempt(run_id=run.id, number=1, executor="import", state=state, submitted_by=actor,
                              **dict(fields))
                s.add(att)
                s.flush()
                self._event(s, entity="attempt", to_state=state, actor=actor, reason=reason, run=run, attempt=att)
            return exp

    def _create(self, s: Session, *, name: str, version: int, method: str, source: str, spec_hash: str,
                spec: Mapping[str, Any], gpus: int, actor: str, runs: Sequence[NewRun], states: Sequence[str],
                source_path: str | None = None, queue: str | None = None, max_gpu_hours: float | None = None,
                reason: str | None = None) -> tuple[Experiment, list[int]]:
        exp = Experiment(name=name, version=version, method=method, source=source, source_path=source_path,
                         spec_hash=spec_hash, spec=dict(spec), queue=queue, gpus=gpus,
                         max_gpu_hours=max_gpu_hours, created_by=actor)
        s.add(exp)
        s.flush()
        self._event(s, entity="experiment", to_state="created", actor=actor, reason=reason, experiment_id=exp.id)
        rows = self._insert_runs(s, exp.id, runs, states, actor=actor, reason=reason)
        return exp, rows

    def get_run(self, run_key: str) -> Run:
        with self.session() as s:
            run = s.scalars(select(Run).where(Run.run_key == run_key)).one_or_none()
            if run is None:
                raise LedgerError(f"no run {run_key!r} in the ledger")
            return run

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

    def mark_not_reproduced(self, run_key: str, *, actor: str, reason: str) -> Run:
        with self.session() as s:
            run = self._locked_run(s, run_key)
            self._move(s, run, "not_reproduced", actor, reason)
            run.cause = reason
            return run

    # -- attempts -------------------------------------------------------------------------------

    def begin_attempt(self, run_key: str, *, executor: str, gpus: int, actor: str, worker: str | None,
                      quota: tuple[str, int] | None = None) -> Attempt:
        """Write the attempt row BEFORE the scheduler is asked, so a crash after sbatch is findable.

        `quota` = (queue, max GPUs in flight): checked in the same transaction under a lock, so two
        workers cannot both pass it; over quota raises QuotaExceeded and writes nothing. A run whose
        last attempt is still `submitting` belongs to whoever began it: only `resolve_submitting`
        (reconcile, after asking the scheduler) may settle it, so it is never submitted twice.
        """
        with self.session() as s:
            run = self._locked_run(s, run_key)
            if run.state != "queued":
                raise LedgerError(f"run {run_key}: is {run.state}, only a queued run can be submitted")
            last = run.attempts[-1] if run.attempts else None
            if last is not None and last.state == "submitting":
                raise LedgerError(f"run {run_key}: attempt {last.number} is being submitted by {last.worker}")
            if quota is not None and quota[1] > 0:
                queue, limit = quota
                self._lock_queue(s, queue)
                used = self._in_flight(s, queue)
                if used + gpus > limit:
                    raise QuotaExceeded(queue, used, gpus, limit)
            number = (last.number + 1) if last else 1
            att = Attempt(run_id=run.id, number=number, executor=executor, state="submitting", gpus=gpus,
                          submitted_by=actor, worker=worker)
            s.add(att)
            s.flush()
            self._event(s, entity="attempt", to_state="submitting", actor=actor, run=run, attempt=att)
            run.worker = worker
            return att

    @staticmethod
    def _lock_queue(s: Session, queue: str) -> None:
        # SQLite already holds the write lock (BEGIN IMMEDIATE); PostgreSQL needs an explicit one.
        if s.get_bind().dialect.name == "postgresql":
            s.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"ggpo-quota:{queue}"))))

    @staticmethod
    def _in_flight(s: Session, queue: str | None) -> int:
        q = (select(func.coalesce(func.sum(Attempt.gpus), 0)).join(Run, Run.id == Attempt.run_id)
             .join(Experiment, Experiment.id == Run.experiment_id)
             .where(Attempt.state.in_(("submitting", "submitted", "running"))))
        if queue is not None:
            q = q.where(Experiment.queue == queue)
        return int(s.scalar(q) or 0)

    def in_flight_gpus(self, queue: str | None = None) -> int:
        """GPUs held or requested by attempts not yet ended (of one queue, if given)."""
        with self.session() as s:
            return self._in_flight(s, queue)

    def resolve_submitting(self, run_key: str, number: int, *, job_id: str | None, actor: str,
                           reason: str, state: str = "lost") -> Attempt:
        """Settle an attempt that never got a job id: the scheduler had it after all (job_id), or it
        never reached one (`state` lost: the worker died; failed: the scheduler refused it)."""
        if job_id is not None:
            return self.mark_submitted(run_key, number, job_id=job_id, actor=actor)
        with self.session() as s:
            run, att = self._locked_attempt(s, run_key, number)
            if att.state != "submitting":
                raise LedgerError(f"run {run_key} attempt {number} is {att.state}, not submitting")
            if state not in ("lost", "failed"):
                raise LedgerError(f"an unsubmitted attempt ends lost or failed, not {state}")
            self._event(s, entity="attempt", from_state="submitting", to_state=state, actor=actor, reason=reason,
                        run=run, attempt=att)
            att.state, att.reason, att.ended_at = state, reason, utcnow()
            att.elapsed_seconds, att.gpu_hours_job = 0.0, 0.0  # never reached a scheduler: nothing allocated
            if run.state == "queued":
                self._move(s, run, state, actor, reason, attempt=att)
                run.cause, run.worker = reason, None
            return att

    def _locked_attempt(self, s: Session, run_key: str, number: int) -> tuple[Run, Attempt]:
        run = self._locked_run(s, run_key)
        att = next((a for a in run.attempts if a.number == number), None)
        if att is None:
            raise LedgerError(f"run {run_key} has no attempt {number}")
        return run, att

    def mark_submitted(self, run_key: str, number: int, *, job_id: str, actor: str) -> Attempt:
        with self.session() as s:
            run, att = self._locked_attempt(s, run_key, number)
            if att.state != "submitting":
                if att.job_id == job_id:
                    return att  # the same worker reporting twice: nothing new happened
                raise LedgerError(f"run {run_key} attempt {number} is {att.state} with job {att.job_id}")
            self._event(s, entity="attempt", from_state=att.state, to_state="submitted", actor=actor,
                        reason=f"job {job_id}", run=run, attempt=att)
            att.state, att.job_id, att.submitted_at = "submitted", job_id, utcnow()
            self._move(s, run, "submitted", actor, f"attempt {number}, job {job_id}", attempt=att)
            return att

    def mark_running(self, run_key: str, number: int, *, actor: str, started_at: datetime | None = None) -> Attempt:
        with self.session() as s:
            run, att = self._locked_attempt(s, run_key, number)
            if att.state == "running":
                return att
            if att.state != "submitted":
                raise LedgerError(f"run {run_key} attempt {number} is {att.state}, not submitted")
            self._event(s, entity="attempt", from_state="submitted", to_state="running", actor=actor, run=run,
                        attempt=att)
            att.state, att.started_at = "running", started_at or utcnow()
            if run.state == "submitted":
                self._move(s, run, "running", actor, None, attempt=att)
            return att

    def mark_finished(self, run_key: str, number: int, *, attempt_state: str, run_state: str | None, actor: str,
                      reason: str | None = None, started_at: datetime | None = None,
                      ended_at: datetime | None = None, elapsed_seconds: float | None = None,
                      gpu_hours_job: float | None = None, gpu_hours_scheduler: float | None = None,
                      scheduler_state: str | None = None, exit_code: str | None = None,
                      result: Mapping[str, Any] | None = None) -> Attempt:
        """End an attempt with its accounting; move the run to `run_state` (None: leave it, e.g. a retry follows)."""
        if attempt_state not in ATTEMPT_FINAL:
            raise LedgerError(f"{attempt_state!r} is not a final attempt state")
        with self.session() as s:
            run, att = self._locked_attempt(s, run_key, number)
            if att.state in ATTEMPT_FINAL:
                raise LedgerError(f"run {run_key} attempt {number} already ended as {att.state}")
            self._event(s, entity="attempt", from_state=att.state, to_state=attempt_state, actor=actor,
                        reason=reason, run=run, attempt=att)
            att.state = attempt_state
            att.reason = reason
            att.started_at = started_at or att.started_at
            att.ended_at = ended_at or utcnow()
            for name, value in (("elapsed_seconds", elapsed_seconds), ("gpu_hours_job", gpu_hours_job),
                                ("gpu_hours_scheduler", gpu_hours_scheduler), ("scheduler_state", scheduler_state),
                                ("exit_code", exit_code)):
                if value is not None:
                    setattr(att, name, value)
            if result is not None:
                run.result = dict(result)
            if run_state is not None and run_state != run.state:
                self._move(s, run, run_state, actor, reason, attempt=att)
                run.cause = reason if run_state != "succeeded" else None
                run.worker = None
            return att

    def book_requeue(self, run_key: str, number: int, *, actor: str, started_at: datetime | None,
                     ended_at: datetime | None, elapsed_seconds: float | None, gpu_hours_scheduler: float | None,
                     next_started_at: datetime | None, node_failed: bool = False) -> Attempt:
        """The scheduler requeued attempt `number` under the same job id (a preemption, or with
        `node_failed` its node failing): end it as preempted / node_fail with its own accounting and
        open attempt number+1 on the same job, in one transaction."""
        with self.session() as s:
            run, att = self._locked_attempt(s, run_key, number)
            if att.state in ATTEMPT_FINAL:
                raise LedgerError(f"run {run_key} attempt {number} already ended as {att.state}")
            state, sched, cause = ("node_fail", "NODE_FAIL", "node failure") if node_failed else (
                "preempted", "PREEMPTED", "preemption")
            reason = f"requeued by the scheduler as job {att.job_id} ({cause})"
            self._event(s, entity="attempt", from_state=att.state, to_state=state, actor=actor, reason=reason,
                        run=run, attempt=att)
            att.state, att.reason, att.scheduler_state = state, reason, sched
            att.started_at = started_at or att.started_at
            att.ended_at, att.elapsed_seconds, att.gpu_hours_scheduler = ended_at, elapsed_seconds, gpu_hours_scheduler
            nxt = Attempt(run_id=run.id, number=number + 1, executor=att.executor, job_id=att.job_id, state="running",
                          gpus=att.gpus, submitted_by=att.submitted_by, worker=att.worker,
                          submitted_at=att.submitted_at, started_at=next_started_at)
            s.add(nxt)
            s.flush()
            self._event(s, entity="attempt", to_state="running", actor=actor, reason=reason, run=run, attempt=nxt)
            if run.state == "submitted":
                self._move(s, run, "running", actor, reason, attempt=nxt)
            return nxt

    def record_accounting(self, run_key: str, number: int, *, actor: str, started_at: datetime | None = None,
                          ended_at: datetime | None = None, elapsed_seconds: float | None = None,
                          gpu_hours_scheduler: float | None = None, scheduler_state: str | None = None) -> Attempt:
        """Store the scheduler's accounting of an attempt (reconcile); no state change."""
        with self.session() as s:
            _run, att = self._locked_attempt(s, run_key, number)
            for name, value in (("started_at", started_at), ("ended_at", ended_at),
                                ("elapsed_seconds", elapsed_seconds), ("gpu_hours_scheduler", gpu_hours_scheduler),
                                ("scheduler_state", scheduler_state)):
                if value is not None:
                    setattr(att, name, value)
            return att

    def active_attempts(self) -> list[tuple[Run, Attempt]]:
        """Attempts that may still hold (or be waiting for) an allocation."""
        with self.session() as s:
            rows = s.execute(
                select(Run, Attempt).join(Attempt, Attempt.run_id == Run.id)
                .where(Attempt.state.in_(("submitting", "submitted", "running")))
                .order_by(Attempt.id)
            ).all()
            return [(r, a) for r, a in rows]

    # -- decisions, artifacts, component runs ----------------------------------------------------------

    def record_decision(self, *, experiment_name: str, kind: str, actor: str, experiment_id: int | None = None,
                        **fields: Any) -> Decision:
        with self.session() as s:
            d = Decision(experiment_name=experiment_name, experiment_id=experiment_id, kind=kind, decided_by=actor,
                         **fields)
            s.add(d)
            s.flush()
            self._event(s, entity="decision", to_state=kind, actor=actor, reason=fields.get("reason"),
                        experiment_id=experiment_id)
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

    def committed_gpu_hours(self, *, user: str | None = None, queue: str | None = None) -> tuple[float, float]:
        """(spent, in flight) GPU-hours of the experiments created by `user` and/or on `queue`.

        Spent books each attempt's figure (the scheduler's, else the job's own); in flight is the
        estimate of every run still queued, submitted or running.
        """
        with self.session() as s:
            spent_q = (select(func.coalesce(func.sum(func.coalesce(Attempt.gpu_hours_scheduler,
                                                                       Attempt.gpu_hours_job)), 0.0))
                       .join(Run, Run.id == Attempt.run_id).join(Experiment, Experiment.id == Run.experiment_id))
            flight_q = (select(func.coalesce(func.sum(Run.estimated_gpu_hours), 0.0))
                        .join(Experiment, Experiment.id == Run.experiment_id)
                        .where(Run.state.in_(("queued",) + ACTIVE_RUN_STATES)))
            if user is not None:
                spent_q = spent_q.where(Experiment.created_by == user)
                flight_q = flight_q.where(Experiment.created_by == user)
            if queue is not None:
                spent_q = spent_q.where(Experiment.queue == queue)
                flight_q = flight_q.where(Experiment.queue == queue)
            return float(s.scalar(spent_q) or 0.0), float(s.scalar(flight_q) or 0.0)

    def apply_decision(self, *, experiment_name: str, kind: str, actor: str, fields: Mapping[str, Any],
                       experiment_id: int | None = None, run_state: str | None = None,
                       new_experiment: Mapping[str, Any] | None = None,
                       new_runs: Sequence[NewRun] = ()) -> tuple[Decision, list[str]]:
        """Record a cost decision and move runs with it, in one transaction; returns (decision, moved run keys).

        `new_experiment` (create_experiment's keywords, without runs) creates the experiment with
        `new_runs` already in `not_reproduced`. `run_state="not_reproduced"` moves the experiment's
        queued runs there (runs that started already cost GPU-hours and are left alone);
        `run_state="queued"` puts its not_reproduced runs back in the queue (the cost was accepted).
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
                    s.execute(update(Run).where(Run.id.in_(rows)).values(cause=why))
                moved = [nr.run_key for nr in new_runs]
            elif run_state is not None and experiment_id is not None:
                source = "queued" if run_state == "not_reproduced" else "not_reproduced"
                keys = list(s.scalars(select(Run.run_key).where(Run.experiment_id == experiment_id,
                                                                Run.state == source).order_by(Run.id)))
                for key in keys:
                    run = self._locked_run(s, key)
                    if run.state != source:  # moved by someone else since the select
                        continue
                    self._move(s, run, run_state, actor, why)
                    run.cause = why if run_state == "not_reproduced" else None
                    moved.append(key)
            d = Decision(experiment_name=experiment_name, experiment_id=experiment_id, kind=kind, decided_by=actor,
                         **dict(fields))
            s.add(d)
            s.flush()
            self._event(s, entity="decision", to_state=kind, actor=actor, reason=why, experiment_id=experiment_id)
            log.info("decision %s on %s by %s; runs moved: %d", kind, experiment_name, actor, len(moved))
            return d, moved

    def record_artifact(self, *, path: str, sha256: str, size_bytes: int, kind: str, run_id: int | None = None,
                        component_run_id: int | None = None) -> Artifact:
        with self.session() as s:
            a = Artifact(path=path, sha256=sha256, size_bytes=size_bytes, kind=kind, run_id=run_id,
                         component_run_id=component_run_id)
            s.add(a)
            return a

    def claim_night(self, *, method: str, tier: str, night: str, actor: str) -> ComponentRun | None:
        """The once-per-night guard: the first caller for (method, tier, night) gets the row, others None."""
        from sqlalchemy.exc import IntegrityError

        try:
            with self.session() as s:
                cr = ComponentRun(method=method, tier=tier, night=night, state="claimed", actor=actor)
                s.add(cr)
                s.flush()
                return cr
        except IntegrityError:
            return None

    def finish_component_run(self, component_run_id: int, *, state: str, record: Mapping[str, Any] | None,
                             seconds: float | None, commit: str | None, dirty: bool | None,
                             error: str | None = None) -> ComponentRun:
        with self.session() as s:
            cr = s.get(ComponentRun, component_run_id, with_for_update=True)
            if cr is None:
                raise LedgerError(f"no component run {component_run_id}")
            if cr.state != "claimed":
                raise LedgerError(f"component run {component_run_id} already {cr.state}")
            cr.state, cr.record, cr.seconds, cr.commit, cr.dirty, cr.error = (
                state, dict(record) if record is not None else None, seconds, commit, dirty, error)
            cr.finished_at = utcnow()
            return cr

    def component_runs(self, *, method: str | None = None, limit: int = 30) -> list[ComponentRun]:
        with self.session() as s:
            q = select(ComponentRun).order_by(ComponentRun.night.desc(), ComponentRun.id.desc()).limit(limit)
            if method is not None:
                q = q.where(ComponentRun.method == method)
            return list(s.scalars(q))

    def artifacts(self, *, run_id: int | None = None, component_run_id: int | None = None) -> list[Artifact]:
        with self.session() as s:
            q = select(Artifact).order_by(Artifact.id)
            if run_id is not None:
                q = q.where(Artifact.run_id == run_id)
            if component_run_id is not None:
                q = q.where(Artifact.component_run_id == component_run_id)
            return list(s.scalars(q))


def _wrap_public(cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if (callable(value) and not name.startswith("_") and name not in ("session", "exclusive")
                and not isinstance(value, staticmethod)):
            setattr(cls, name, _retrying(value))


_wrap_public(Ledger)
