"""Attempt transitions: one allocation of a run, from submitting to its final state, with the
GPU quota checked in the same transaction."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..errors import LedgerError
from ..states import ATTEMPT_FINAL, IN_FLIGHT_ATTEMPT_STATES, UNSUBMITTED_ATTEMPT_END
from .core import LedgerCore
from .schema import (
    Attempt,
    Experiment,
    Run,
    utcnow,
)


class QuotaExceeded(LedgerError):
    """Submitting would put a queue over its GPU quota; the run stays queued (deferred)."""

    def __init__(self, queue: str, used: int, gpus: int, limit: int) -> None:
        super().__init__(f"queue {queue}: {used} GPUs in flight + {gpus} > quota {limit}")
        self.queue, self.used, self.gpus, self.limit = queue, used, gpus, limit


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
        """The state of attempt `number` of a run (None if there is none): one column, no run loaded."""
        with self.session() as s:
            return s.scalar(select(Attempt.state).join(Run, Run.id == Attempt.run_id)
                            .where(Run.run_key == run_key, Attempt.number == number))

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
                      result: Mapping[str, Any] | None = None,
                      outcome: Mapping[str, Any] | None = None) -> Attempt:
        """End an attempt with its accounting; move the run to `run_state` (None: leave it, e.g. a retry follows).
        `outcome`, the evaluation's figures (ggpo_batch/outcome.py), is booked with `result`."""
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
            if outcome is not None:
                run.outcome = dict(outcome)
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
                .where(Attempt.state.in_(IN_FLIGHT_ATTEMPT_STATES))
                .order_by(Attempt.id)
            ).all()
            return [(r, a) for r, a in rows]
