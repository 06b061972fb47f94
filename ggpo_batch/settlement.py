"""What the end of an attempt means for its run: one place that maps a scheduler's final state
(and the run's result record) onto ledger transitions, used by the worker and by reconcile.

Infrastructure failures (preemption, node failure, a lost allocation) may be retried when the
spec allows `retries = N`; a training error, a TIMEOUT or a bad record never is.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .accounting import gpu_hours
from .allocation import details_path, record_path
from .executor.base import JobInfo
from .ledger import Ledger
from .ledger.schema import Attempt, Run
from .outcome import read_outcome
from .run_record import check_run_record, entry_key
from .states import (
    INFRASTRUCTURE_ATTEMPT_STATES,
    RUN_STATE_AFTER,
    SCHEDULER_INFRASTRUCTURE,
    attempt_state_of,
)

log = logging.getLogger(__name__)


def retries_used(run: Run) -> int:
    """Attempts of `run` that ended for an infrastructure cause: the retries it has had."""
    return sum(1 for a in run.attempts if a.state in INFRASTRUCTURE_ATTEMPT_STATES)


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


def decide(run: Run, attempt: Attempt, info: JobInfo, folder: Path) -> Outcome:
    """The transitions an attempt's end implies (pure: reads the record, writes nothing)."""
    state = attempt_state_of(info.state)
    reason = None if info.state == "COMPLETED" else f"{info.state}" + (f" (exit {info.exit_code})" if info.exit_code
                                                                         else "")
    record = None
    if state == "succeeded":
        record, problem = _read_record(folder, run)
        if problem:
            state, reason = "failed", problem
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
    return Outcome(state, RUN_STATE_AFTER[state], reason, record, retry=False)


def settle(ledger: Ledger, run: Run, attempt: Attempt, info: JobInfo, folder: Path, *, actor: str) -> Outcome:
    """Book the end of `attempt`: state, times, both GPU-hour figures, result and the evaluation's
    outcome (from the details file, when the job wrote one); re-queue if allowed."""
    out, fields = _conclude(run, attempt, info, folder)
    ledger.mark_finished(run.run_key, attempt.number, actor=actor, **fields)
    return _after(ledger, run, attempt, info, folder, out, actor=actor)


def settle_own(ledger: Ledger, run_key: str, number: int, info: JobInfo, folder: Path, *, actor: str,
               job_id: str | None = None) -> Outcome:
    """`settle` for the worker that ran the job itself: decided on the run as the finishing
    transaction locks it (no read of the run before). With `job_id` the attempt is booked as
    submitted to that job in the same transaction (`Ledger.settle_attempt`)."""
    decided: list[Outcome] = []

    def conclude(run: Run, attempt: Attempt) -> dict[str, Any]:
        out, fields = _conclude(run, attempt, info, folder)
        decided[:] = [out]  # the transaction may be retried: keep the last decision
        return fields

    run, attempt = ledger.settle_attempt(run_key, number, conclude, actor=actor, job_id=job_id)
    return _after(ledger, run, attempt, info, folder, decided[0], actor=actor)


def _conclude(run: Run, attempt: Attempt, info: JobInfo, folder: Path) -> tuple[Outcome, dict[str, Any]]:
    """The decision and the `mark_finished` fields it implies."""
    out = decide(run, attempt, info, folder)
    job_gh = None
    elapsed = info.elapsed_seconds
    outcome = None
    if out.record is not None:
        timing = out.record["timing"]
        job_gh = timing["allocated_gpu_hours_through_evaluation"]
        elapsed = elapsed if elapsed is not None else timing["elapsed_seconds"]
        outcome, why = read_outcome(details_path(folder))
        if why:  # the record alone makes the run: it succeeds without an outcome (the report says so)
            log.warning("run %s attempt %d: no evaluation outcome: %s", run.run_key, attempt.number, why)
    elif elapsed is not None:
        job_gh = gpu_hours(attempt.gpus, elapsed)
    return out, {"attempt_state": out.attempt_state, "run_state": out.run_state, "reason": out.reason,
                 "started_at": info.start, "ended_at": info.end, "elapsed_seconds": elapsed, "gpu_hours_job": job_gh,
                 "gpu_hours_scheduler": info.gpu_hours, "scheduler_state": info.state, "exit_code": info.exit_code,
                 "result": out.record, "outcome": outcome}


def _after(ledger: Ledger, run: Run, attempt: Attempt, info: JobInfo, folder: Path, out: Outcome, *,
           actor: str) -> Outcome:
    """What follows the booked end: the record as an artifact, the infrastructure retry."""
    rec_path = record_path(folder)
    if out.record is not None:
        ledger.record_artifact(path=str(rec_path), sha256=hashlib.sha256(rec_path.read_bytes()).hexdigest(),
                               size_bytes=rec_path.stat().st_size, kind="run_record", run_id=run.id)
    if out.retry:
        ledger.requeue(run.run_key, actor=actor, reason=out.reason or "infrastructure retry")
    log.info("run %s attempt %d: %s -> run %s", run.run_key, attempt.number, info.state, out.run_state or "re-queued")
    return out
