"""Cancel and retry: decisions a person makes about runs, recorded with who and why."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..config.settings import Settings
from ..contracts.runspec import RunSpec
from ..contracts.states import CANCELLABLE_RUN_STATES, LIVE_JOB_ATTEMPT_STATES, RETRYABLE_RUN_STATES
from ..errors import LedgerError
from ..executor import make_executor
from ..ledger import Ledger
from .queue import RunQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CancelResult:
    run_key: str
    was: str
    removed_jobs: int
    cancelled_job: str | None


def cancel_runs(ledger: Ledger, settings: Settings, run_keys: list[str], *, actor: str,
                reason: str | None = None, only: frozenset[str] = CANCELLABLE_RUN_STATES) -> list[CancelResult]:
    """Cancel runs: the run marked cancelled, then its waiting RQ jobs removed and its allocation
    cancelled (scancel).

    The ledger first: a cancellation it refuses (another person's run, where the ledger's
    permissions say no: NotPermitted) leaves the queue and the scheduler untouched; a worker that
    takes the run's job meanwhile finds it cancelled and does not submit it. A run that already
    ended (or, with `only`, is in none of those states) is left alone. The cancelled allocation's GPU-hours are booked by the next reconcile, from
    the scheduler's accounting.
    """
    out = []
    for key in run_keys:
        was = ledger.get_run(key).state
        if was not in CANCELLABLE_RUN_STATES or was not in only:
            continue
        run = ledger.mark_cancelled(key, actor=actor, reason=reason or f"cancelled by {actor}")
        queue = RunQueue.from_url(settings.redis_url, settings.queue_for(run.experiment.queue))
        removed = queue.remove(key)
        job = None
        last = run.attempts[-1] if run.attempts else None
        if last is not None and last.job_id and last.state in LIVE_JOB_ATTEMPT_STATES:
            spec = RunSpec.from_dict(run.run_spec)
            make_executor(last.executor, jobs_dir=settings.jobs_dir, profile=spec.profile).cancel(last.job_id)
            job = last.job_id
        out.append(CancelResult(key, was, removed, job))
        log.info("cancelled %s (was %s, job %s)", key, was, job)
    return out


def retry_run(ledger: Ledger, settings: Settings, run_key: str, *, actor: str, reason: str) -> int:
    """Queue a new attempt of an ended run by hand; returns the number the next attempt will get."""
    if not reason.strip():
        raise LedgerError("a retry needs --reason: re-running until a seed works is selection")
    run = ledger.get_run(run_key)
    if run.experiment.source != "spec":
        # An imported run ran elsewhere: its row holds a summary of the record, not a run spec a
        # worker can submit, so queueing it would fail on every attempt.
        raise LedgerError(f"run {run_key} was imported from a results file ({run.experiment.source_path}); it has "
                          f"no runnable spec and cannot be retried: enqueue a spec to run it again")
    if run.state not in RETRYABLE_RUN_STATES:
        raise LedgerError(f"run {run_key} is {run.state}; only {', '.join(RETRYABLE_RUN_STATES)} runs can be retried")
    ledger.requeue(run_key, actor=actor, reason=f"manual retry: {reason.strip()}")
    queue = RunQueue.from_url(settings.redis_url, settings.queue_for(run.experiment.queue))
    queue.forget([run_key])
    queue.enqueue([run_key], run.priority)
    return len(run.attempts) + 1
