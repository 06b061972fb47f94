"""Attempt transitions: one allocation of a run, from submitting to its final state, with the
GPU quota checked in the same transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Row,
    and_,
    bindparam,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from ..errors import LedgerError
from ..priorities import DEFAULT_PRIORITY
from ..states import (
    ATTEMPT_FINAL,
    ATTEMPT_KIND_CONTINUATION,
    ATTEMPT_KIND_TRAINING,
    IN_FLIGHT_ATTEMPT_STATES,
    UNSUBMITTED_ATTEMPT_END,
)
from .core import LedgerCore, missing_run
from .events import RowEvents
from .new_evaluations import write_new_evaluations
from .observations import Observations
from .schema import (
    Attempt,
    Experiment,
    Run,
    utcnow,
)

_RUN, _ATT, _EXP = Run.__table__, Attempt.__table__, Experiment.__table__
_RUN_READ = ("id", "experiment_id", "run_key", "arm", "seed", "state", "retries_allowed", "cause", "worker",
             "updated_at")
_RUN_WRITE = ("state", "cause", "worker", "updated_at")  # what a transition changes on its run
_NEW_ATTEMPT = ("run_id", "number", "executor", "kind", "state", "gpus", "submitted_by", "worker", "created_at")
# what a transition changes on an attempt (not the heartbeat, which reconcile copies unlocked)
_ATT_WRITE = ("state", "reason", "job_id", "submitted_at", "started_at", "ended_at", "elapsed_seconds",
              "gpu_hours_job", "gpu_hours_scheduler", "scheduler_state", "exit_code")

# The statements of a worker's job, built once per process rather than once per job (building
# them cost about a third of a job's ledger time).
# Values travel as parameters; an UPDATE's SET columns are the keys of its parameters.
_RUN_ROW = (select(*(_RUN.c[c] for c in _RUN_READ)).where(_RUN.c.run_key == bindparam("key"))
            .with_for_update())
# The run's last attempt, joined to its row: a worker's first step reads both in one round trip.
_LAST = _ATT.alias("last_attempt")
_LAST_READ = ("number", "state", "worker")
# Has an earlier attempt of the run ended at its time limit? Then the next one continues the run
# past it (from the run's checkpoint): its kind is continuation.
_TIMED_OUT = (select(func.count()).select_from(_ATT)
              .where(_ATT.c.run_id == _RUN.c.id, _ATT.c.state == "timeout").scalar_subquery())
_SUBMISSION_ROW = (select(*(_RUN.c[c] for c in _RUN_READ), _RUN.c.run_spec, _RUN.c.priority, _EXP.c.queue,
                          _EXP.c.created_by.label("owner"), *(_LAST.c[c].label(f"last_{c}") for c in _LAST_READ),
                          _TIMED_OUT.label("timed_out"))
                   .join_from(_RUN, _EXP, _EXP.c.id == _RUN.c.experiment_id)
                   .outerjoin(_LAST, and_(_LAST.c.run_id == _RUN.c.id,
                                          _LAST.c.number == select(func.max(_ATT.c.number))
                                          .where(_ATT.c.run_id == _RUN.c.id).scalar_subquery()))
                   .where(_RUN.c.run_key == bindparam("key")).with_for_update(of=_RUN))
_LAST_ATTEMPT = (select(*(_ATT.c[c] for c in _LAST_READ)).where(_ATT.c.run_id == bindparam("run"))
                 .order_by(_ATT.c.number.desc()).limit(1))
_RUN_TIMED_OUT = select(func.count()).select_from(_ATT).where(_ATT.c.run_id == bindparam("run"),
                                                              _ATT.c.state == "timeout")
# The run (locked) with every attempt, one row per attempt (one row with NULL attempt columns if
# it has none): a transition reads both in one round trip.
_ATT_COLS = tuple(c.name for c in _ATT.c)
_RUN_WITH_ATTEMPTS = (select(*(_RUN.c[c] for c in _RUN_READ), *(_ATT.c[c].label(f"attempt_{c}") for c in _ATT_COLS))
                      .outerjoin_from(_RUN, _ATT, _ATT.c.run_id == _RUN.c.id)
                      .where(_RUN.c.run_key == bindparam("key")).order_by(_ATT.c.number).with_for_update(of=_RUN))
_ATTEMPT_STATE = (select(_ATT.c.state).join_from(_ATT, _RUN, _RUN.c.id == _ATT.c.run_id)
                  .where(_RUN.c.run_key == bindparam("key"), _ATT.c.number == bindparam("number")))
_NEW_ATTEMPT_ROW = insert(_ATT)


class _Last(NamedTuple):
    """A run's latest attempt, as `_begin` needs it."""

    number: int | None
    state: str | None
    worker: str | None


class QuotaExceeded(LedgerError):
    """Submitting would put a queue (or one person's runs) over its GPU quota; the run stays queued
    (deferred)."""

    def __init__(self, queue: str, used: int, gpus: int, limit: int, *, whose: str = "queue") -> None:
        super().__init__(f"{whose} {queue}: {used} GPUs in flight + {gpus} > quota {limit}")
        self.queue, self.used, self.gpus, self.limit = queue, used, gpus, limit
        self.priority = DEFAULT_PRIORITY


class UserQuota(NamedTuple):
    """The GPUs one person's runs may hold in flight: `default` (0: no limit), or for a member of
    one of `by_role`'s PostgreSQL roles the largest of theirs."""

    default: int
    by_role: tuple[tuple[str, int], ...] = ()


class AttemptPlan(NamedTuple):
    """How to begin an attempt: its executor, its GPUs, the quota it must fit under ((queue, max
    GPUs in flight), or None), and the per-person quota of the run's owner (the experiment's
    creator), or None."""

    executor: str
    gpus: int
    quota: tuple[str, int] | None = None
    user_quota: UserQuota | None = None


class Submission(NamedTuple):
    """What `begin_submission` found and did: the run's state, spec and experiment queue as it
    locked them, and the attempt it began (None when the run was not queued); the run's priority
    and owner (who created its experiment)."""

    state: str
    run_spec: dict[str, Any]
    queue: str | None
    attempt: Attempt | None
    priority: str = DEFAULT_PRIORITY
    owner: str | None = None


def end_attempt(att: Attempt, state: str, reason: str | None, *, started_at: datetime | None,
                ended_at: datetime | None, **figures: Any) -> None:
    """Apply an attempt's end: its final state and reason, its times (the scheduler's, else now) and
    the accounting figures given (elapsed, both GPU-hour figures, scheduler state, exit code)."""
    att.state, att.reason = state, reason
    att.started_at = started_at or att.started_at
    att.ended_at = ended_at or utcnow()
    for name, value in figures.items():
        if value is not None:
            setattr(att, name, value)


class AttemptTransitions(LedgerCore):
    """Attempts: begin (under the queue quota), submitted, running, finished, requeued, accounted."""

    def begin_attempt(self, run_key: str, *, executor: str, gpus: int, actor: str, worker: str | None,
                      quota: tuple[str, int] | None = None) -> Attempt:
        """Write the attempt row BEFORE the scheduler is asked, so a crash after sbatch is findable.

        `quota` = (queue, max GPUs in flight): checked in the same transaction under a lock, so two
        workers cannot both pass it; over quota raises QuotaExceeded and writes nothing. A run whose
        last attempt is still `submitting` belongs to whoever began it: only `resolve_submitting`
        (reconcile, after asking the scheduler) may settle it, so it is never submitted twice.
        """
        with self.transaction() as conn:
            run = self._run_row(conn, run_key)
            if run.state != "queued":
                raise LedgerError(f"run {run_key}: is {run.state}, only a queued run can be submitted")
            last = conn.execute(_LAST_ATTEMPT, {"run": run.id}).one_or_none()
            timed_out = bool(conn.scalar(_RUN_TIMED_OUT, {"run": run.id}))
            return self._begin(conn, run, last, AttemptPlan(executor, gpus, quota), actor=actor, worker=worker,
                               owner=None, continues=timed_out)

    def begin_submission(self, run_key: str, *, actor: str, worker: str | None,
                         plan: Callable[[dict[str, Any], str | None], AttemptPlan]) -> Submission:
        """A worker's first step, in one transaction: read the run (locked) with its spec and its
        experiment's queue, and if it is queued begin its next attempt as `plan(run_spec, queue)`
        says (`begin_attempt`'s checks and quota). A run that is not queued comes back as it is,
        with nothing written."""
        with self.transaction() as conn:
            row = conn.execute(_SUBMISSION_ROW, {"key": run_key}).one_or_none()
            if row is None:
                raise missing_run(conn, run_key)
            fields = row._asdict()
            run_spec, queue, priority, owner = (fields.pop(k) for k in ("run_spec", "queue", "priority", "owner"))
            last = _Last(*(fields.pop(f"last_{c}") for c in _LAST_READ))
            timed_out = bool(fields.pop("timed_out"))
            run = Run(**fields)
            if run.state != "queued":
                return Submission(run.state, run_spec, queue, None, priority, owner)
            try:
                att = self._begin(conn, run, last if last.number is not None else None, plan(run_spec, queue),
                                  actor=actor, worker=worker, owner=owner,
                                  continues=timed_out)
            except QuotaExceeded as exc:
                exc.priority = priority  # the deferred run goes back on its own priority's queue
                raise
            return Submission(run.state, run_spec, queue, att, priority, owner)

    def _begin(self, conn: Connection, run: Run, last: _Last | Row[Any] | None, plan: AttemptPlan, *, actor: str,
               worker: str | None, owner: str | None, continues: bool = False) -> Attempt:
        """Begin the next attempt of `run` (queued, locked by this transaction) after `last`, its
        latest attempt (number, state, worker; None if it has none), and end the transaction.
        `owner`: who created the run's experiment (read if None and the plan has a user quota).
        `continues`: an earlier attempt ended at its time limit, so this one is a continuation."""
        if last is not None and last.state == "submitting":
            raise LedgerError(f"run {run.run_key}: attempt {last.number} is being submitted by {last.worker}")
        if plan.quota is not None and plan.quota[1] > 0:
            queue, limit = plan.quota
            self._lock_queue(conn, queue)
            used = self._in_flight(conn, queue)
            if used + plan.gpus > limit:
                raise QuotaExceeded(queue, used, plan.gpus, limit)
        if plan.user_quota is not None:
            if owner is None:
                owner = conn.scalar(select(_EXP.c.created_by).where(_EXP.c.id == run.experiment_id))
            self._check_user_quota(conn, owner or "", plan.gpus, plan.user_quota)
        kind = ATTEMPT_KIND_CONTINUATION if continues else ATTEMPT_KIND_TRAINING
        att = Attempt(run_id=run.id, number=(last.number + 1) if last else 1, executor=plan.executor, kind=kind,
                      state="submitting", gpus=plan.gpus, submitted_by=actor, worker=worker, created_at=utcnow())
        att.id = conn.execute(_NEW_ATTEMPT_ROW, {c: getattr(att, c) for c in _NEW_ATTEMPT}).inserted_primary_key[0]
        events = RowEvents(actor)
        events.add(entity="attempt", to_state="submitting", run=run, attempt_id=att.id)
        with self.commit_after(conn) as update_row:
            events.write(conn)
            update_row(_RUN, run.id, {"worker": worker}, f"beginning run {run.run_key}")
        return att

    def _check_user_quota(self, conn: Connection, owner: str, gpus: int, quota: UserQuota) -> None:
        """Raise QuotaExceeded if `owner`'s runs would hold more GPUs than their quota with `gpus`
        more; checked under a lock of theirs, so two workers cannot both pass it."""
        limit = self._user_limit(conn, owner, quota)
        if limit <= 0:
            return
        self._lock_queue(conn, f"user:{owner}")
        used = int(conn.scalar(select(func.coalesce(func.sum(_ATT.c.gpus), 0))
                               .join_from(_ATT, _RUN, _RUN.c.id == _ATT.c.run_id)
                               .join(_EXP, _EXP.c.id == _RUN.c.experiment_id)
                               .where(_ATT.c.state.in_(IN_FLIGHT_ATTEMPT_STATES), _EXP.c.created_by == owner)) or 0)
        if used + gpus > limit:
            raise QuotaExceeded(owner, used, gpus, limit, whose="user")

    @staticmethod
    def _user_limit(conn: Connection, owner: str, quota: UserQuota) -> int:
        """The quota of `owner`: the largest of the per-role limits of the PostgreSQL roles they are a
        member of, else the default. SQLite has no roles: the default."""
        if not quota.by_role or conn.dialect.name != "postgresql":
            return quota.default
        roles = [role for role, _ in quota.by_role]
        mine = set(conn.scalars(text(
            "SELECT r FROM unnest(CAST(:roles AS text[])) AS r WHERE to_regrole(:owner) IS NOT NULL "
            "AND to_regrole(r) IS NOT NULL AND pg_has_role(to_regrole(:owner), to_regrole(r), 'MEMBER')"),
            {"roles": roles, "owner": owner}))
        limits = [gpus for role, gpus in quota.by_role if role in mine]
        return max(limits) if limits else quota.default

    @staticmethod
    def _run_row(conn: Connection, run_key: str) -> Run:
        """The run, locked for this transaction, as a detached object read from one row (no
        experiment, no attempts): what the row-level transitions below check and change."""
        row = conn.execute(_RUN_ROW, {"key": run_key}).one_or_none()
        if row is None:
            raise missing_run(conn, run_key)
        return Run(**row._mapping)

    def _attempt_row(self, conn: Connection, run_key: str, number: int) -> tuple[Run, Attempt]:
        """The run (locked) with its attempts, and attempt `number`, as detached objects read from
        the rows of one query."""
        rows = conn.execute(_RUN_WITH_ATTEMPTS, {"key": run_key}).all()
        if not rows:
            raise missing_run(conn, run_key)
        run = Run(**{c: getattr(rows[0], c) for c in _RUN_READ})
        attempts = [Attempt(**{c: getattr(r, f"attempt_{c}") for c in _ATT_COLS}) for r in rows
                    if r.attempt_id is not None]
        set_committed_value(run, "attempts", attempts)
        att = next((a for a in attempts if a.number == number), None)
        if att is None:
            raise LedgerError(f"run {run_key} has no attempt {number}")
        return run, att

    def _write_rows(self, conn: Connection, run: Run, att: Attempt, events: RowEvents,
                    run_values: Mapping[str, Any] | None = None, evaluations: Sequence[Any] = ()) -> None:
        """Store what a row-level transition changed, and end its transaction: the attempt's
        transition columns, the run's state columns (with `run_values`, e.g. its result), the
        `evaluations` its success queues (ledger/evaluation_rows.py), and the events, sent with the commit."""
        with self.commit_after(conn) as update_row:
            update_row(_ATT, att.id, {c: getattr(att, c) for c in _ATT_WRITE},
                       f"attempt {att.number} of run {run.run_key}")
            update_row(_RUN, run.id, {**{c: getattr(run, c) for c in _RUN_WRITE}, **(run_values or {})},
                       f"run {run.run_key}")
            write_new_evaluations(conn, [(run, e) for e in evaluations], events, actor=events.actor)
            events.write(conn)

    @staticmethod
    def _lock_queue(conn: Connection, queue: str) -> None:
        # SQLite already holds the write lock (BEGIN IMMEDIATE); PostgreSQL needs an explicit one.
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"ggpo-quota:{queue}"))))

    @staticmethod
    def _in_flight(s: Connection | Session, queue: str | None) -> int:
        q = (select(func.coalesce(func.sum(Attempt.gpus), 0)).join(Run, Run.id == Attempt.run_id)
             .join(Experiment, Experiment.id == Run.experiment_id)
             .where(Attempt.state.in_(IN_FLIGHT_ATTEMPT_STATES)))
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
            if state not in UNSUBMITTED_ATTEMPT_END:
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

    def attempt_state(self, run_key: str, number: int) -> str | None:
        """The state of attempt `number` of a run (None if there is none): one column, no run
        loaded, one round trip (a worker's fence before sbatch)."""
        with self.reading() as conn:
            return conn.scalar(_ATTEMPT_STATE, {"key": run_key, "number": number})

    def mark_submitted(self, run_key: str, number: int, *, job_id: str, actor: str) -> Attempt:
        with self.transaction() as conn:
            run, att = self._attempt_row(conn, run_key, number)
            if att.state != "submitting" and att.job_id == job_id:
                return att  # the same worker reporting twice: nothing new happened
            events = RowEvents(actor)
            self._submitted(run, att, job_id=job_id, events=events)
            self._write_rows(conn, run, att, events)
            return att

    @staticmethod
    def _submitted(run: Run, att: Attempt, *, job_id: str, events: RowEvents) -> None:
        if att.state != "submitting":
            raise LedgerError(f"run {run.run_key} attempt {att.number} is {att.state} with job {att.job_id}")
        events.add(entity="attempt", from_state=att.state, to_state="submitted", reason=f"job {job_id}", run=run,
                   attempt_id=att.id)
        att.state, att.job_id, att.submitted_at = "submitted", job_id, utcnow()
        events.move(run, "submitted", f"attempt {att.number}, job {job_id}", att.id)

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
                      result: Mapping[str, Any] | None = None,
                      outcome: Mapping[str, Any] | None = None, evaluations: Sequence[Any] = (),
                      observations: Observations | None = None) -> Attempt:
        """End an attempt with its accounting; move the run to `run_state` (None: leave it, e.g. a retry follows).
        `outcome`, the evaluation's figures (ggpo_batch/outcome.py), is booked with `result`;
        `evaluations` (NewEvaluation rows) are added if the run succeeds, and `observations` (the job's
        provenance and the run's curve) are booked with the attempt's end, in the same transaction."""
        if attempt_state not in ATTEMPT_FINAL:
            raise LedgerError(f"{attempt_state!r} is not a final attempt state")
        fields = {"attempt_state": attempt_state, "run_state": run_state, "reason": reason, "started_at": started_at,
                  "ended_at": ended_at, "elapsed_seconds": elapsed_seconds, "gpu_hours_job": gpu_hours_job,
                  "gpu_hours_scheduler": gpu_hours_scheduler, "scheduler_state": scheduler_state,
                  "exit_code": exit_code, "result": result, "outcome": outcome, "evaluations": evaluations,
                  "observations": observations}
        return self.settle_attempt(run_key, number, lambda _run, _att: fields, actor=actor)[1]

    def settle_attempt(self, run_key: str, number: int, conclude: Callable[[Run, Attempt], Mapping[str, Any]], *,
                       actor: str, job_id: str | None = None) -> tuple[Run, Attempt]:
        """End attempt `number` with what `conclude(run, attempt)` returns (`mark_finished`'s fields),
        decided on the run as this transaction locked it: no separate read of the run before.

        With `job_id`, the attempt is first booked as submitted to that job, in the same transaction
        and with the same events as `mark_submitted`: an in-process executor's job has ended by the
        time its submit returns. Raises LedgerError, writing nothing, if the attempt is no longer
        `submitting` then (reconcile settled it meanwhile)."""
        with self.transaction() as conn:
            run, att = self._attempt_row(conn, run_key, number)
            events = RowEvents(actor)
            if job_id is not None:
                self._submitted(run, att, job_id=job_id, events=events)
            fields = dict(conclude(run, att))
            evaluations = fields.pop("evaluations", None) or ()
            if fields["attempt_state"] not in ATTEMPT_FINAL:
                raise LedgerError(f"{fields['attempt_state']!r} is not a final attempt state")
            was = run.state
            observations = fields.pop("observations", None)
            run_values = self._finish(run, att, events=events, **fields)
            if observations is not None:
                observations.write(conn, run.id, att.id)
            queued = evaluations if run.state == "succeeded" and was != "succeeded" else ()  # by its success
            self._write_rows(conn, run, att, events, run_values, queued)
            return run, att

    @staticmethod
    def _finish(run: Run, att: Attempt, *, events: RowEvents, attempt_state: str, run_state: str | None,
                reason: str | None = None, started_at: datetime | None = None, ended_at: datetime | None = None,
                elapsed_seconds: float | None = None, gpu_hours_job: float | None = None,
                gpu_hours_scheduler: float | None = None, scheduler_state: str | None = None,
                exit_code: str | None = None, result: Mapping[str, Any] | None = None,
                outcome: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Apply an attempt's end to `run` and `att`; returns the run's JSON columns to store."""
        if att.state in ATTEMPT_FINAL:
            raise LedgerError(f"run {run.run_key} attempt {att.number} already ended as {att.state}")
        events.add(entity="attempt", from_state=att.state, to_state=attempt_state, reason=reason, run=run,
                   attempt_id=att.id)
        end_attempt(att, attempt_state, reason, started_at=started_at, ended_at=ended_at,
                    elapsed_seconds=elapsed_seconds, gpu_hours_job=gpu_hours_job,
                    gpu_hours_scheduler=gpu_hours_scheduler, scheduler_state=scheduler_state, exit_code=exit_code)
        if run_state is not None and run_state != run.state:
            events.move(run, run_state, reason, att.id)
            run.cause = reason if run_state != "succeeded" else None
            run.worker = None
        json_values = {"result": result, "outcome": outcome}
        return {k: dict(v) for k, v in json_values.items() if v is not None}

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
            nxt = Attempt(run_id=run.id, number=number + 1, executor=att.executor, kind=att.kind, job_id=att.job_id,
                          state="running",
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
                .where(Attempt.state.in_(IN_FLIGHT_ATTEMPT_STATES))
                .order_by(Attempt.id)
            ).all()
            return [(r, a) for r, a in rows]
