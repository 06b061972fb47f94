"""Evaluations after training in the ledger: their rows (one per succeeded run and outcome-set name)
and their transitions, each with its attempt (kind `evaluation`, the run's next number) and events
in one transaction. The run is never moved: it stays succeeded while its evaluations run.

queued -> submitted -> running -> succeeded | failed | timeout | cancelled | lost (states.py); a
queued evaluation with no RQ job is put back on the queue by reconcile (`queued_evaluation_keys`),
as a queued run is. Submission is exactly-once as for a run: the attempt row is written
`submitting` before the scheduler is asked, and a worker that died then is settled by reconcile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, undefer

from ..contracts.states import (
    ATTEMPT_FINAL,
    ATTEMPT_KIND_EVALUATION,
    RETRYABLE_EVALUATION_STATES,
    UNFINISHED_EVALUATION_STATES,
    UNSUBMITTED_ATTEMPT_END,
    evaluation_can_move,
)
from ..errors import LedgerError
from .attempts import AttemptTransitions, end_attempt
from .core import LedgerCore
from .events import RowEvents
from .new_evaluations import NewEvaluation, reason_of, write_new_evaluations
from .quotas import QuotaExceeded
from .schema import Attempt, Evaluation, Experiment, Run, utcnow
from .submissions import AttemptPlan

_EVAL = Evaluation.__table__


class EvaluationRecords(LedgerCore):
    """Evaluations after training: add, read, begin (under the queue quota), submitted, running,
    finished, cancelled, requeued by hand; and the outcome sets they book."""

    # -- adding and reading -------------------------------------------------------------------

    def add_evaluations(self, new: Sequence[NewEvaluation], *, actor: str) -> list[str]:
        """Add evaluations in one transaction, leaving out any whose run already has one of that name;
        returns the keys added."""
        if not new:
            return []
        with self.session() as s:
            have = {(r, n) for r, n in s.execute(select(Evaluation.run_id, Evaluation.name)
                                                 .where(Evaluation.run_id.in_(sorted({n.run_id for n in new}))))}
            todo = [n for n in new if (n.run_id, n.name) not in have]
            runs = {r.id: r for r in s.scalars(select(Run).where(Run.id.in_([n.run_id for n in todo])))}
            events = RowEvents(actor)
            write_new_evaluations(s.connection(), [(runs[n.run_id], n) for n in todo], events, actor=actor)
            events.write(s.connection())
            return [n.key for n in todo]

    def get_evaluation(self, key: str) -> Evaluation:
        with self.session() as s:
            ev = s.scalars(select(Evaluation).options(undefer(Evaluation.outcome))
                           .where(Evaluation.key == key)).unique().one_or_none()
            if ev is None:
                raise LedgerError(f"no evaluation {key!r} in the ledger")
            return ev

    def evaluation_key_of(self, evaluation_id: int) -> str:
        """The key of the evaluation with this id (an attempt's `evaluation_id`)."""
        with self.reading() as conn:
            key = conn.scalar(select(_EVAL.c.key).where(_EVAL.c.id == evaluation_id))
        if key is None:
            raise LedgerError(f"no evaluation with id {evaluation_id} in the ledger")
        return str(key)

    def evaluations(self, *, experiment_id: int | None = None, run_ids: Iterable[int] | None = None,
                    name: str | None = None, states: Iterable[str] | None = None) -> list[Evaluation]:
        """Evaluations (with their run), filtered; in run and name order."""
        with self.session() as s:
            q = select(Evaluation).join(Run, Run.id == Evaluation.run_id).order_by(Run.arm, Run.seed, Evaluation.name)
            if experiment_id is not None:
                q = q.where(Run.experiment_id == experiment_id)
            if run_ids is not None:
                q = q.where(Evaluation.run_id.in_(list(run_ids)))
            if name is not None:
                q = q.where(Evaluation.name == name)
            if states is not None:
                q = q.where(Evaluation.state.in_(list(states)))
            return list(s.scalars(q).unique())

    def evaluation_states(self, experiment_ids: Iterable[int]) -> dict[int, list[tuple[str, str]]]:
        """Run id -> [(name, state)] of the evaluations of these experiments' runs: one query, no JSON."""
        ids = list(experiment_ids)
        if not ids:
            return {}
        out: dict[int, list[tuple[str, str]]] = {}
        with self.session() as s:
            rows = s.execute(select(Evaluation.run_id, Evaluation.name, Evaluation.state)
                             .join(Run, Run.id == Evaluation.run_id).where(Run.experiment_id.in_(ids))
                             .order_by(Evaluation.run_id, Evaluation.name))
            for run_id, name, state in rows:
                out.setdefault(run_id, []).append((name, state))
        return out

    def outcome_set(self, experiment_id: int, name: str) -> dict[int, dict[str, Any]]:
        """Run id -> outcome of the outcome set `name` of one experiment version's runs (succeeded
        evaluations that booked one)."""
        with self.session() as s:
            rows = s.execute(select(Evaluation.run_id, Evaluation.outcome).join(Run, Run.id == Evaluation.run_id)
                             .where(Run.experiment_id == experiment_id, Evaluation.name == name,
                                    Evaluation.state == "succeeded", Evaluation.outcome.is_not(None)))
            return {i: o for i, o in rows if o is not None}

    def outcome_set_names(self, experiment_id: int) -> list[str]:
        """The names of the evaluations of one experiment version, in order."""
        with self.session() as s:
            return sorted(set(s.scalars(select(Evaluation.name).join(Run, Run.id == Evaluation.run_id)
                                        .where(Run.experiment_id == experiment_id))))

    def queued_evaluation_keys(self, queue: str, *, default_queue: str) -> set[str]:
        """Keys of the evaluations queued on `queue` whose attempt is not being submitted right now."""
        with self.session() as s:
            keys = set(s.scalars(select(Evaluation.key).join(Run, Run.id == Evaluation.run_id)
                                 .join(Experiment, Experiment.id == Run.experiment_id)
                                 .where(Evaluation.state == "queued",
                                        func.coalesce(Experiment.queue, default_queue) == queue)))
            busy = set(s.scalars(select(Evaluation.key).join(Attempt, Attempt.evaluation_id == Evaluation.id)
                                 .where(Attempt.state == "submitting")))
            return keys - busy

    def count_queued_evaluations(self, queues: Iterable[str], *, default_queue: str) -> int:
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(Evaluation).join(Run, Run.id == Evaluation.run_id)
                                .join(Experiment, Experiment.id == Run.experiment_id)
                                .where(Evaluation.state == "queued",
                                       func.coalesce(Experiment.queue, default_queue).in_(list(queues)))) or 0)

    # -- transitions ---------------------------------------------------------------------------

    def _locked_evaluation(self, s: Session, key: str) -> tuple[Evaluation, Run]:
        """The evaluation and its run, both locked for this transaction (the run: attempt numbers)."""
        ev = s.scalars(select(Evaluation).where(Evaluation.key == key)
                       .with_for_update(of=Evaluation)).unique().one_or_none()
        if ev is None:
            raise LedgerError(f"no evaluation {key!r} in the ledger")
        return ev, self._locked_run(s, ev.run.run_key)

    @staticmethod
    def _evaluation_attempt(run: Run, ev: Evaluation, number: int) -> Attempt:
        att = next((a for a in run.attempts if a.number == number), None)
        if att is None or att.evaluation_id != ev.id:
            raise LedgerError(f"evaluation {ev.key} has no attempt {number}")
        return att

    def _move_evaluation(self, s: Session, ev: Evaluation, run: Run, to: str, actor: str, reason: str | None,
                         attempt: Attempt | None = None) -> None:
        if not evaluation_can_move(ev.state, to):
            raise LedgerError(f"evaluation {ev.key}: cannot go from {ev.state} to {to}")
        self._event(s, entity="evaluation", from_state=ev.state, to_state=to, actor=actor, reason=reason_of(ev, reason),
                    run=run, attempt=attempt)
        ev.state, ev.updated_at = to, utcnow()

    def begin_evaluation(self, key: str, *, actor: str, worker: str | None,
                         plan: Callable[[dict[str, Any], str | None], AttemptPlan],
                         ) -> tuple[Evaluation, Attempt | None]:
        """A worker's first step for an evaluation: if it is queued, write its next attempt
        (`submitting`) as `plan(spec, experiment queue)` says, under the queue's GPU quota
        (QuotaExceeded writes nothing); else return it as it is, with no attempt."""
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            if ev.state != "queued":
                return ev, None
            last = run.attempts[-1] if run.attempts else None
            if last is not None and last.state == "submitting":
                raise LedgerError(f"run {run.run_key}: attempt {last.number} is being submitted by {last.worker}")
            how = plan(dict(ev.spec), run.experiment.queue)
            if how.quota is not None and how.quota[1] > 0:
                queue, limit = how.quota
                AttemptTransitions._lock_queue(s.connection(), queue)
                used = AttemptTransitions._in_flight(s, queue)
                if used + how.gpus > limit:
                    raise QuotaExceeded(queue, used, how.gpus, limit)
            att = Attempt(run_id=run.id, number=(last.number + 1) if last else 1, executor=how.executor,
                          kind=ATTEMPT_KIND_EVALUATION, evaluation_id=ev.id, state="submitting", gpus=how.gpus,
                          submitted_by=actor, worker=worker, created_at=utcnow())
            s.add(att)
            s.flush()
            self._event(s, entity="attempt", to_state="submitting", actor=actor, reason=reason_of(ev), run=run,
                        attempt=att)
            return ev, att

    def mark_evaluation_submitted(self, key: str, number: int, *, job_id: str, actor: str) -> Attempt:
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            att = self._evaluation_attempt(run, ev, number)
            if att.state != "submitting" and att.job_id == job_id:
                return att
            self._evaluation_submitted(s, ev, run, att, job_id=job_id, actor=actor)
            return att

    def _evaluation_submitted(self, s: Session, ev: Evaluation, run: Run, att: Attempt, *, job_id: str,
                              actor: str) -> None:
        if att.state != "submitting":
            raise LedgerError(f"evaluation {ev.key} attempt {att.number} is {att.state} with job {att.job_id}")
        self._event(s, entity="attempt", from_state="submitting", to_state="submitted", actor=actor,
                    reason=reason_of(ev, f"job {job_id}"), run=run, attempt=att)
        att.state, att.job_id, att.submitted_at = "submitted", job_id, utcnow()
        if ev.state == "queued":
            self._move_evaluation(s, ev, run, "submitted", actor, f"attempt {att.number}, job {job_id}", att)

    def mark_evaluation_running(self, key: str, number: int, *, actor: str,
                                started_at: datetime | None = None) -> Attempt:
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            att = self._evaluation_attempt(run, ev, number)
            if att.state == "running":
                return att
            if att.state != "submitted":
                raise LedgerError(f"evaluation {key} attempt {number} is {att.state}, not submitted")
            self._event(s, entity="attempt", from_state="submitted", to_state="running", actor=actor,
                        reason=reason_of(ev), run=run, attempt=att)
            att.state, att.started_at = "running", started_at or utcnow()
            if ev.state == "submitted":
                self._move_evaluation(s, ev, run, "running", actor, None, att)
            return att

    def finish_evaluation(self, key: str, number: int, *, attempt_state: str, evaluation_state: str | None,
                          actor: str, reason: str | None = None, job_id: str | None = None,
                          started_at: datetime | None = None, ended_at: datetime | None = None,
                          elapsed_seconds: float | None = None, gpu_hours_job: float | None = None,
                          gpu_hours_scheduler: float | None = None, scheduler_state: str | None = None,
                          exit_code: str | None = None, outcome: Mapping[str, Any] | None = None,
                          record: Mapping[str, Any] | None = None) -> tuple[Evaluation, Attempt]:
        """End an evaluation's attempt with its accounting and move the evaluation to
        `evaluation_state` (None: leave it, e.g. it was cancelled meanwhile), booking its outcome and
        record; with `job_id` the attempt is first booked as submitted to that job (a debug job ended
        inside its submit), all in one transaction."""
        if attempt_state not in ATTEMPT_FINAL:
            raise LedgerError(f"{attempt_state!r} is not a final attempt state")
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            att = self._evaluation_attempt(run, ev, number)
            if job_id is not None:
                self._evaluation_submitted(s, ev, run, att, job_id=job_id, actor=actor)
            if att.state in ATTEMPT_FINAL:
                raise LedgerError(f"evaluation {key} attempt {number} already ended as {att.state}")
            self._event(s, entity="attempt", from_state=att.state, to_state=attempt_state, actor=actor,
                        reason=reason_of(ev, reason), run=run, attempt=att)
            end_attempt(att, attempt_state, reason, started_at=started_at, ended_at=ended_at,
                        elapsed_seconds=elapsed_seconds, gpu_hours_job=gpu_hours_job,
                        gpu_hours_scheduler=gpu_hours_scheduler, scheduler_state=scheduler_state, exit_code=exit_code)
            if evaluation_state is not None and evaluation_state != ev.state:
                self._move_evaluation(s, ev, run, evaluation_state, actor, reason, att)
                ev.cause = reason if evaluation_state != "succeeded" else None
            if outcome is not None:
                ev.outcome = dict(outcome)
            if record is not None:
                ev.record = dict(record)
            return ev, att

    def resolve_evaluation_submitting(self, key: str, number: int, *, job_id: str | None, actor: str, reason: str,
                                      state: str = "lost") -> Attempt:
        """An evaluation's attempt that never got a job id: the scheduler had it after all (`job_id`),
        or it never reached one (`state` lost or failed, and so does the evaluation)."""
        if job_id is not None:
            return self.mark_evaluation_submitted(key, number, job_id=job_id, actor=actor)
        if state not in UNSUBMITTED_ATTEMPT_END:
            raise LedgerError(f"an unsubmitted attempt ends lost or failed, not {state}")
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            att = self._evaluation_attempt(run, ev, number)
            if att.state != "submitting":
                raise LedgerError(f"evaluation {key} attempt {number} is {att.state}, not submitting")
            self._event(s, entity="attempt", from_state="submitting", to_state=state, actor=actor,
                        reason=reason_of(ev, reason), run=run, attempt=att)
            att.state, att.reason, att.ended_at = state, reason, utcnow()
            att.elapsed_seconds, att.gpu_hours_job = 0.0, 0.0  # never reached a scheduler: nothing allocated
            if ev.state == "queued":
                self._move_evaluation(s, ev, run, state, actor, reason, att)
                ev.cause = reason
            return att

    def cancel_evaluation(self, key: str, *, actor: str, reason: str) -> Evaluation:
        """The evaluation is cancelled now; a job it has is cancelled by the caller, and its attempt
        booked by reconcile once the scheduler has ended it."""
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            if ev.state not in UNFINISHED_EVALUATION_STATES:
                raise LedgerError(f"evaluation {key} is {ev.state}: nothing to cancel")
            self._move_evaluation(s, ev, run, "cancelled", actor, reason)
            for att in run.attempts:
                if att.evaluation_id == ev.id and att.state == "submitting":
                    self._event(s, entity="attempt", from_state="submitting", to_state="cancelled", actor=actor,
                                reason=reason_of(ev, reason), run=run, attempt=att)
                    att.state, att.ended_at = "cancelled", utcnow()
            ev.cause = reason
            return ev

    def requeue_evaluation(self, key: str, *, actor: str, reason: str,
                           spec: Mapping[str, Any] | None = None) -> Evaluation:
        """Back to queued, by hand (`retry --evaluation`): an evaluation that ended without success;
        with `spec`, what its job is given next (its data file checked again)."""
        if not reason.strip():
            raise LedgerError("a retry needs a reason")
        with self.session() as s:
            ev, run = self._locked_evaluation(s, key)
            if ev.state not in RETRYABLE_EVALUATION_STATES:
                raise LedgerError(f"evaluation {key} is {ev.state}; only {', '.join(RETRYABLE_EVALUATION_STATES)} "
                                  f"evaluations can be retried")
            self._move_evaluation(s, ev, run, "queued", actor, reason)
            ev.cause = None
            if spec is not None:
                ev.spec = dict(spec)
            return ev
