"""Canaries before a sweep in the ledger (schema.Canary, migration 0013): created with the held runs
of an enqueue, one per shape; read by experiment version; their transitions, each with its attempt
(kind `canary`, the next number of the run it stands for, which stays held) and events in one
transaction. control/canary.py decides what a canary's end does to the runs it holds.

queued -> submitted -> running -> passed | failed | lost (contracts/canary_spec.py); back to queued
after an infrastructure end (node failure, preemption) and by `canary --rerun`. Never continued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, undefer

from ..contracts.canary_spec import CANARY_FINAL, CANARY_PRIORITY, CanarySpec
from ..contracts.states import ATTEMPT_KIND_CANARY, CANARY_CANCEL_PREFIX, HELD
from ..errors import LedgerError
from .attempts import end_attempt
from .core import LedgerCore
from .schema import Attempt, Canary, Experiment, Run, utcnow


class CanaryRecords(LedgerCore):
    """Canaries: create, read by experiment version, begin, submitted, running, ended, queued again;
    and the runs a failed canary cancelled, back to held for a rerun."""

    def create_canaries(self, experiment_id: int, specs: Sequence[CanarySpec], *, actor: str) -> list[str]:
        """One queued canary per spec (skipping a key the ledger has); returns the keys created."""
        if not specs:
            return []
        with self.session() as s:
            have = set(s.scalars(select(Canary.key).where(Canary.experiment_id == experiment_id)))
            runs = {r.run_key: r for r in s.scalars(select(Run).where(Run.run_key.in_([c.run_key for c in specs])))}
            made = []
            for c in specs:
                if c.key in have:
                    continue
                run = runs.get(c.run_key)
                if run is None:
                    raise LedgerError(f"canary {c.key}: no run {c.run_key}")
                s.add(Canary(experiment_id=experiment_id, run_id=run.id, key=c.key, shape=dict(c.shape),
                             spec=c.to_dict(), state="queued", gpus=c.gpus, created_by=actor))
                self._event(s, entity="canary", to_state="queued", actor=actor, run=run,
                            reason=f"canary {c.key} for {len(c.run_keys)} held run(s)")
                made.append(c.key)
            return made

    def canaries(self, experiment_id: int) -> list[Canary]:
        """The canaries of an experiment version (with their records), oldest first."""
        with self.session() as s:
            return list(s.scalars(select(Canary).options(undefer(Canary.record))
                                  .where(Canary.experiment_id == experiment_id).order_by(Canary.id)))

    def canary(self, key: str) -> Canary:
        with self.session() as s:
            c = s.scalars(select(Canary).options(undefer(Canary.record)).where(Canary.key == key)).one_or_none()
            if c is None:
                raise LedgerError(f"no canary {key!r}")
            return c

    def canary_of_run(self, run_id: int) -> Canary:
        """The canary standing for run `run_id` (whose attempts of kind `canary` are its)."""
        with self.session() as s:
            c = s.scalars(select(Canary).where(Canary.run_id == run_id)).one_or_none()
            if c is None:
                raise LedgerError(f"run id {run_id} has no canary")
            return c

    def queued_canary_keys(self, queue: str, *, default_queue: str) -> dict[str, str]:
        """Keys of the canaries queued on `queue` -> the priority they wait at (reconcile puts back those
        Redis lost), but those whose attempt is being submitted right now."""
        with self.session() as s:
            rows = s.execute(select(Canary.key, Run.id).join(Run, Run.id == Canary.run_id)
                             .join(Experiment, Experiment.id == Canary.experiment_id)
                             .where(Canary.state == "queued", func.coalesce(Experiment.queue, default_queue) == queue)).all()
            busy = set(s.scalars(select(Attempt.run_id).where(Attempt.state == "submitting",
                                                               Attempt.kind == ATTEMPT_KIND_CANARY)))
            return {key: CANARY_PRIORITY for key, run_id in rows if run_id not in busy}

    # -- transitions ---------------------------------------------------------------------------

    def _locked(self, s: Session, key: str) -> tuple[Canary, Run]:
        c = s.scalars(select(Canary).where(Canary.key == key).with_for_update(of=Canary)).one_or_none()
        if c is None:
            raise LedgerError(f"no canary {key!r}")
        return c, self._locked_run(s, c.run.run_key)

    def _move_canary(self, s: Session, c: Canary, run: Run, to: str, actor: str, reason: str | None,
                     att: Attempt | None = None) -> None:
        self._event(s, entity="canary", from_state=c.state, to_state=to, actor=actor, reason=reason, run=run,
                    attempt=att)
        c.state, c.updated_at = to, utcnow()

    @staticmethod
    def _attempt(run: Run, number: int) -> Attempt:
        att = next((a for a in run.attempts if a.number == number and a.kind == ATTEMPT_KIND_CANARY), None)
        if att is None:
            raise LedgerError(f"run {run.run_key} has no canary attempt {number}")
        return att

    def begin_canary(self, key: str, *, actor: str, worker: str | None, executor: str,
                     gpus: int) -> tuple[Canary, Attempt | None]:
        """A worker's first step: if the canary is queued, write its attempt (`submitting`) on the run
        it stands for; else return it as it is, with no attempt."""
        with self.session() as s:
            c, run = self._locked(s, key)
            if c.state != "queued":
                return c, None
            last = run.attempts[-1] if run.attempts else None
            if last is not None and last.state == "submitting":
                raise LedgerError(f"run {run.run_key}: attempt {last.number} is being submitted by {last.worker}")
            att = Attempt(run_id=run.id, number=(last.number + 1) if last else 1, executor=executor,
                          kind=ATTEMPT_KIND_CANARY, state="submitting", gpus=gpus, submitted_by=actor,
                          worker=worker, created_at=utcnow())
            s.add(att)
            s.flush()
            self._event(s, entity="attempt", to_state="submitting", actor=actor, reason=f"canary {key}", run=run,
                        attempt=att)
            return c, att

    def mark_canary_submitted(self, key: str, number: int, *, job_id: str, actor: str) -> None:
        with self.session() as s:
            c, run = self._locked(s, key)
            att = self._attempt(run, number)
            if att.state != "submitting":
                raise LedgerError(f"canary {key} attempt {number} is {att.state} with job {att.job_id}")
            self._event(s, entity="attempt", from_state="submitting", to_state="submitted", actor=actor,
                        reason=f"canary {key}, job {job_id}", run=run, attempt=att)
            att.state, att.job_id, att.submitted_at = "submitted", job_id, utcnow()
            self._move_canary(s, c, run, "submitted", actor, f"attempt {number}, job {job_id}", att)

    def mark_canary_running(self, key: str, number: int, *, actor: str, started_at: datetime | None = None) -> None:
        with self.session() as s:
            c, run = self._locked(s, key)
            att = self._attempt(run, number)
            if att.state != "submitted":
                return
            self._event(s, entity="attempt", from_state="submitted", to_state="running", actor=actor,
                        reason=f"canary {key}", run=run, attempt=att)
            att.state, att.started_at = "running", started_at or utcnow()
            self._move_canary(s, c, run, "running", actor, f"attempt {number}", att)

    def end_canary(self, key: str, number: int, *, attempt_state: str, canary_state: str, reason: str | None,
                   record: Mapping[str, Any] | None, actor: str, job_id: str | None = None,
                   started_at: datetime | None = None, ended_at: datetime | None = None,
                   **figures: Any) -> Canary:
        """Book a canary attempt's end (its state, times and GPU-hour figures) and the canary's state
        (`passed`, `failed`, `lost`, or `queued` again after an infrastructure end) in one transaction.
        A failed canary's event makes the `canary_failed` notification."""
        with self.session() as s:
            c, run = self._locked(s, key)
            att = self._attempt(run, number)
            if att.state in ("succeeded", "failed", "timeout", "cancelled", "lost", "preempted", "node_fail"):
                return c  # booked already (reconcile and the worker both saw it)
            if job_id is not None and att.job_id is None:
                att.job_id, att.submitted_at = job_id, utcnow()
            self._event(s, entity="attempt", from_state=att.state, to_state=attempt_state, actor=actor,
                        reason=reason, run=run, attempt=att)
            end_attempt(att, attempt_state, reason, started_at=started_at, ended_at=ended_at, **figures)
            self._move_canary(s, c, run, canary_state, actor, reason, att)
            c.reason = reason if canary_state != "passed" else None
            if record is not None:
                c.record = dict(record)
            s.flush()
            s.refresh(c, ["record"])
            return c

    def requeue_canary(self, key: str, *, actor: str, reason: str) -> Canary:
        """A failed (or lost) canary back to queued: `canary --rerun` after a fix."""
        with self.session() as s:
            c, run = self._locked(s, key)
            if c.state not in CANARY_FINAL or c.state == "passed":
                raise LedgerError(f"canary {key} is {c.state}: only a failed or lost canary is re-run")
            self._move_canary(s, c, run, "queued", actor, reason)
            c.reason = None
            return c

    def rehold_cancelled(self, experiment_id: int, run_keys: Iterable[str], *, actor: str, reason: str) -> list[str]:
        """The runs of `run_keys` that a failed canary cancelled (their cause says so) back to held, in
        one transaction; returns those moved. Runs cancelled for any other reason are left alone."""
        with self.session() as s:
            keys = list(s.scalars(select(Run.run_key).where(Run.experiment_id == experiment_id,
                                                            Run.run_key.in_(list(run_keys)),
                                                            Run.state == "cancelled").order_by(Run.id)))
            moved = []
            for key in keys:
                run = self._locked_run(s, key)
                if run.state != "cancelled" or not (run.cause or "").startswith(CANARY_CANCEL_PREFIX):
                    continue
                self._move(s, run, HELD, actor, reason)
                run.cause = None
                moved.append(key)
            return moved
