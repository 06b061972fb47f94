"""What the end of an attempt means for its run: one place that maps a scheduler's final state
(and the run's result record) onto ledger transitions, used by the worker and by reconcile.

Infrastructure failures (preemption, node failure, a lost allocation) may be retried when the
spec allows `retries = N`; a training error or a bad record never is. A TIMEOUT ends the run
`timeout`, unless the job checkpointed at its time limit and the spec asks for continuations
(continuation.py): then the run goes back to the queue, in the same transaction, for a new attempt.

GPU-hours: each attempt is booked with its own allocation's figures. A job that resumed bills the
earlier allocations in its record (whose loop seconds span them); the job's own figure booked on
the attempt is this allocation's alone (the details' `allocation_elapsed_seconds`), so no
allocation is counted twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.settings import Settings
from ..contracts.accounting import attempt_gpu_hours, gpu_hours
from ..contracts.allocation import details_path, record_path, stopped_path
from ..contracts.outcome import read_outcome
from ..contracts.run_record import check_run_record, entry_key
from ..contracts.runspec import run_lifecycle
from ..contracts.states import (
    ATTEMPT_KIND_CANARY,
    INFRASTRUCTURE_ATTEMPT_STATES,
    RUN_STATE_AFTER,
    SCHEDULER_INFRASTRUCTURE,
    attempt_state_of,
)
from ..executor.base import JobInfo
from ..ledger import Ledger
from ..ledger.observations import Observations
from ..ledger.schema import Attempt, Run
from .continuation import TimeLimitNote, judge, read_note
from .costguard import CapCheck, check_continuation
from .evaluations import enqueue_evaluations, for_run, planned_by_spec

log = logging.getLogger(__name__)


def retries_used(run: Run) -> int:
    """Attempts of `run` that ended for an infrastructure cause: the retries it has had (its canary's,
    booked on the run it stands for, are the canary's own: control/canary.py)."""
    return sum(1 for a in run.attempts if a.state in INFRASTRUCTURE_ATTEMPT_STATES and a.kind != ATTEMPT_KIND_CANARY)


def over_allowance(run: Run) -> bool:
    """Has the scheduler (e.g. requeueing after a node failure) retried `run` more than its spec allows?"""
    return retries_used(run) > run.retries_allowed


@dataclass(frozen=True)
class Outcome:
    attempt_state: str
    run_state: str | None  # None: the run is re-queued (infrastructure retry) or already final
    reason: str | None
    record: dict[str, Any] | None
    retry: bool
    continues: bool = False  # the run continues past its time limit (run_state "queued")

    @property
    def requeued(self) -> bool:
        """Does the run go back on the queue (a retry, or a continuation)?"""
        return self.retry or self.continues


def _read_record(folder: Path, run: Run) -> tuple[dict[str, Any] | None, str | None]:
    path = record_path(folder)
    if not path.exists():
        return None, "the job ended without writing its result record"
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"result record unreadable: {exc}"
    problems = check_run_record(entry_key(run.seed, run.arm), rec)
    if problems:
        return None, "result record invalid: " + "; ".join(problems[:3])
    return rec, None


def _stopped_reason(folder: Path) -> str | None:
    """Why the job stopped itself (contracts/allocation.py STOPPED_NAME), cut to one line; None without it."""
    try:
        reason = json.loads(stopped_path(folder).read_text()).get("reason")
    except (OSError, ValueError, AttributeError):
        return None
    return " ".join(reason.split())[:1000] if isinstance(reason, str) and reason.strip() else None


def decide(run: Run, attempt: Attempt, info: JobInfo, folder: Path, cost: CapCheck | None = None) -> Outcome:
    """The transitions an attempt's end implies (pure: reads the job's files, writes nothing).
    `cost`: the cost guard's check of a continuation past a time limit (`continuation_cost`)."""
    state = attempt_state_of(info.state)
    reason = None if info.state == "COMPLETED" else f"{info.state}" + (f" (exit {info.exit_code})" if info.exit_code
                                                                         else "")
    record = None
    if state == "succeeded":
        record, problem = _read_record(folder, run)
        if problem:
            state, reason = "failed", problem
    elif state == "failed" and (why := _stopped_reason(folder)):
        reason = f"{reason}: {why}"  # the job stopped itself (a failed weight-sync probe): a training failure
    if run.state == "cancelled":
        return Outcome(state, None, reason, record, retry=False)
    if info.state == "CANCELLED" and over_allowance(run):
        reason = (f"CANCELLED: the scheduler requeued the job past the spec's retries = {run.retries_allowed} "
                  f"({retries_used(run)} infrastructure failures); cancelled before it could run again")
        return Outcome(state, "failed", reason, record, retry=False)
    infra = info.state in SCHEDULER_INFRASTRUCTURE
    used = retries_used(run) + (1 if infra else 0)
    if infra and used <= run.retries_allowed:
        reason = f"{reason}; infrastructure retry {used}/{run.retries_allowed}"
        return Outcome(state, None, reason, record, retry=True)
    if info.state == "TIMEOUT":
        verdict = judge(run, attempt, read_note(folder), cost)
        return Outcome(state, "queued" if verdict.continues else RUN_STATE_AFTER[state], verdict.reason, None,
                       retry=False, continues=verdict.continues)
    return Outcome(state, RUN_STATE_AFTER[state], reason, record, retry=False)


def continuation_cost(ledger: Ledger, run: Run, attempt: Attempt, info: JobInfo, folder: Path,
                      settings: Settings | None) -> CapCheck | None:
    """The cost guard's check of continuing `run` after `attempt` ended at its time limit; None when
    no continuation is possible (no checkpoint at the limit, no progress, or not asked for)."""
    note = read_note(folder)
    if info.state != "TIMEOUT" or note is None or not note.progressed or not run_lifecycle(run.run_spec)[0]:
        return None
    spent = attempt_gpu_hours(gpu_hours(attempt.gpus, note.elapsed_seconds), info.gpu_hours)
    return check_continuation(ledger, run, spent_now=spent or 0.0, remaining_loop_seconds=note.remaining_loop_seconds,
                              settings=settings)


def settle(ledger: Ledger, run: Run, attempt: Attempt, info: JobInfo, folder: Path, *, actor: str,
           settings: Settings | None = None) -> Outcome:
    """Book the end of `attempt`: state, times, both GPU-hour figures, result and the evaluation's
    outcome (from the details file, when the job wrote one); re-queue if allowed, or continue the
    run past its time limit (the cost guard consulted with `settings`' caps). A run that succeeds
    queues its spec's [[evaluations]] in the same transaction (evaluations.py)."""
    cost = continuation_cost(ledger, run, attempt, info, folder, settings)
    planned = _planned(run.run_spec, run.run_key, info, folder)
    out, fields = _conclude(run, attempt, info, folder, cost)
    fields["evaluations"] = for_run(planned, run.id) if out.run_state == "succeeded" else []
    ledger.mark_finished(run.run_key, attempt.number, actor=actor, **fields)
    return _after(ledger, run, attempt, info, folder, out, actor=actor, evaluations=fields["evaluations"],
                  settings=settings, queue=settings.queue_for(run.experiment.queue) if settings else None)


def settle_own(ledger: Ledger, run_key: str, number: int, info: JobInfo, folder: Path, *, actor: str,
               job_id: str | None = None, settings: Settings | None = None,
               run_spec: dict[str, Any] | None = None, queue: str | None = None) -> Outcome:
    """`settle` for the worker that ran the job itself: decided on the run as the finishing
    transaction locks it (no read of the run before, but for the cost guard's check of a
    continuation past a time limit, or for the spec of a completed run whose worker did not pass
    `run_spec`). With `job_id` the attempt is booked as submitted to that job in the same transaction
    (`Ledger.settle_attempt`). `queue`: where the spec's [[evaluations]] go on Redis."""
    decided: list[Outcome] = []
    cost = None
    if info.state == "TIMEOUT":
        whole = ledger.get_run(run_key)
        run_spec = whole.run_spec
        cost = continuation_cost(ledger, whole, next(a for a in whole.attempts if a.number == number), info, folder,
                                 settings)
    elif info.state == "COMPLETED" and run_spec is None:
        run_spec = ledger.submission_view(run_key)[1]
    planned = _planned(run_spec, run_key, info, folder)  # files read before the transaction, not in it
    queued: list[Any] = []

    def conclude(run: Run, attempt: Attempt) -> dict[str, Any]:
        if run_spec is not None:  # the locked run is read without its spec, which a continuation reads
            run.run_spec = run_spec
        out, fields = _conclude(run, attempt, info, folder, cost)
        queued[:] = for_run(planned, run.id) if out.run_state == "succeeded" else []
        decided[:] = [out]  # the transaction may be retried: keep the last decision
        return {**fields, "evaluations": queued}

    run, attempt = ledger.settle_attempt(run_key, number, conclude, actor=actor, job_id=job_id)
    return _after(ledger, run, attempt, info, folder, decided[0], actor=actor, evaluations=queued, settings=settings,
                  queue=queue)


def _planned(run_spec: dict[str, Any] | None, run_key: str, info: JobInfo, folder: Path) -> list[Any]:
    """The spec's [[evaluations]] a completed job's run would queue if its attempt is booked succeeded."""
    return planned_by_spec(run_spec, run_key, folder) if info.state == "COMPLETED" else []


def _own_seconds(folder: Path, record: dict[str, Any]) -> float:
    """This allocation's elapsed seconds by the job's own clock: the details' figure (a job that
    resumed bills earlier allocations in its record too), else the record's (an older job)."""
    try:
        own = json.loads(details_path(folder).read_text()).get("allocation_elapsed_seconds")
    except (OSError, ValueError, AttributeError):
        own = None
    if isinstance(own, (int, float)) and not isinstance(own, bool) and 0 <= own <= record["timing"]["elapsed_seconds"]:
        return float(own)
    return float(record["timing"]["elapsed_seconds"])


def _conclude(run: Run, attempt: Attempt, info: JobInfo, folder: Path,
              cost: CapCheck | None = None) -> tuple[Outcome, dict[str, Any]]:
    """The decision and the `mark_finished` fields it implies."""
    out = decide(run, attempt, info, folder, cost)
    job_gh = None
    elapsed = info.elapsed_seconds
    outcome = None
    note: TimeLimitNote | None = read_note(folder) if out.attempt_state == "timeout" else None
    if out.record is not None:
        own = _own_seconds(folder, out.record)
        job_gh = gpu_hours(attempt.gpus, own)
        elapsed = elapsed if elapsed is not None else own
        outcome, why = read_outcome(details_path(folder))
        if why:  # the record alone makes the run: it succeeds without an outcome (the report says so)
            log.warning("run %s attempt %d: no evaluation outcome: %s", run.run_key, attempt.number, why)
    elif note is not None:  # stopped at its time limit: its own clock through the checkpoint
        job_gh = gpu_hours(attempt.gpus, note.elapsed_seconds)
        elapsed = elapsed if elapsed is not None else note.elapsed_seconds
    elif elapsed is not None:
        job_gh = gpu_hours(attempt.gpus, elapsed)
    return out, {"attempt_state": out.attempt_state, "run_state": out.run_state, "reason": out.reason,
                 "started_at": info.start, "ended_at": info.end, "elapsed_seconds": elapsed, "gpu_hours_job": job_gh,
                 "gpu_hours_scheduler": info.gpu_hours, "scheduler_state": info.state, "exit_code": info.exit_code,
                 "result": out.record, "outcome": outcome,
                 "observations": observations(folder, with_record=out.record is not None)}


def observations(folder: Path, *, with_record: bool) -> Observations | None:
    """What the job recorded of itself in `folder`: its provenance (run_provenance.py) and the run's
    learning curve, from the details' history when the attempt booked a record, else from the curve
    file it kept while it trained (curve.py); None when it left neither."""
    from ..contracts.curve import points_of, read_curve
    from ..contracts.provenance import read_provenance, split_distributions

    prov = read_provenance(folder)
    doc, listed = split_distributions(prov) if prov is not None else (None, None)
    points: list[dict[str, Any]] = []
    if with_record:
        try:
            history = json.loads(details_path(folder).read_text()).get("history")
        except (OSError, ValueError, AttributeError):
            history = None
        points = points_of(e for e in history if isinstance(e, dict)) if isinstance(history, list) else []
    points = points or read_curve(folder)
    return Observations(doc, listed, points or None) if doc is not None or points else None


def _after(ledger: Ledger, run: Run, attempt: Attempt, info: JobInfo, folder: Path, out: Outcome, *,
           actor: str, evaluations: Sequence[Any] = (), settings: Settings | None = None,
           queue: str | None = None) -> Outcome:
    """What follows the booked end: the record as an artifact, the infrastructure retry, the RQ jobs
    of the evaluations its success queued (without `settings` or a `queue`, reconcile enqueues them)."""
    keys = [e.key for e in evaluations if e.state == "queued"]
    if keys and settings is not None and queue is not None:
        enqueue_evaluations(settings, queue, keys)
    rec_path = record_path(folder)
    if out.record is not None:
        ledger.record_artifact(path=str(rec_path), sha256=hashlib.sha256(rec_path.read_bytes()).hexdigest(),
                               size_bytes=rec_path.stat().st_size, kind="run_record", run_id=run.id)
    if out.retry:
        ledger.requeue(run.run_key, actor=actor, reason=out.reason or "infrastructure retry")
    if out.record is not None:  # booked: the checkpoint has served, unless the spec keeps it
        from .cleanup import drop_checkpoint

        drop_checkpoint(ledger, run.run_key, folder, actor=actor)
    log.info("run %s attempt %d: %s -> run %s", run.run_key, attempt.number, info.state, out.run_state or "re-queued")
    return out
