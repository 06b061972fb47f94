"""Attempt transitions: one allocation of a run, from submitting to its final state, with the
GPU quota checked in the same transaction."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    bindparam,
    select,
)
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from ..contracts.states import (
    ATTEMPT_FINAL,
    IN_FLIGHT_ATTEMPT_STATES,
    UNSUBMITTED_ATTEMPT_END,
)
from ..errors import LedgerError
from .core import missing_run
from .events import RowEvents
from .new_evaluations import write_new_evaluations
from .observations import Observations
from .schema import (
    Attempt,
    Experiment,
    Run,
    utcnow,
)
from .submissions import _RUN_READ, AttemptBeginnings

_RUN, _ATT, _EXP = Run.__table__, Attempt.__table__, Experiment.__table__
_RUN_WRITE = ("state", "cause", "worker", "updated_at")  # what a transition changes on its run
# what a transition changes on an attempt (not the heartbeat, which reconcile copies unlocked)
_ATT_WRITE = ("state", "reason", "job_id", "submitted_at", "started_at", "ended_at", "elapsed_seconds",
              "gpu_hours_job", "gpu_hours_scheduler", "scheduler_state", "exit_code")

# The statements of a worker's job, built once per process rather than once per job (building
# them cost about a third of a job's ledger time).
# Values travel as parameters; an UPDATE's SET columns are the keys of its parameters.
# The run (locked) with every attempt, one row per attempt (one row with NULL attempt columns if
# it has none): a transition reads both in one round trip.
_ATT_COLS = tuple(c.name for c in _ATT.c)
_RUN_WITH_ATTEMPTS = (select(*(_RUN.c[c] for c in _RUN_READ), *(_ATT.c[c].label(f"attempt_{c}") for c in _ATT_COLS))
                      .outerjoin_from(_RUN, _ATT, _ATT.c.run_id == _RUN.c.id)
                      .where(_RUN.c.run_key == bindparam("key")).order_by(_ATT.c.number).with_for_update(of=_RUN))
_ATTEMPT_STATE = (select(_ATT.c.state).join_from(_ATT, _RUN, _RUN.c.id == _ATT.c.run_id)
                  .where(_RUN.c.run_key == bindparam("key"), _ATT.c.number == bindparam("number")))


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


class AttemptTransitions(AttemptBeginnings):
    """Attempts: begin (under the queue quota), submitted, running, finished, requeued, accounted."""

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
        `outcome`, the evaluation's figures (ggpo_batch/contracts/outcome.py), is booked with `result`;
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
