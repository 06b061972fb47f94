"""Reconcile: make the ledger agree with the executors, and Redis agree with the ledger.

One cycle asks each executor about all its active attempts in ONE call (for Slurm: one sacct),
books the ones that ended, settles attempts whose worker died while submitting (found by name:
submitted; not found: lost), takes the looks of sequential designs whose wave has ended
(waves.py: the next wave released, or an arm's held runs cancelled), re-queues runs (and
evaluations after training) the ledger has as queued but Redis has lost, and ends with the notifications (ggpo_batch/notify/cycle.py): what it
observed, and the outbox delivered. An evaluation's attempt is booked by evaluation_jobs.py: its run
is never moved.
Idempotent: a second cycle with nothing new changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import InterfaceError, OperationalError

from ..common import metrics
from ..config.logs import log_context
from ..config.settings import Settings
from ..contracts.allocation import attempt_folder
from ..contracts.heartbeat import read_heartbeat
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec
from ..contracts.states import (
    ATTEMPT_KIND_CANARY,
    ATTEMPT_KIND_EVALUATION,
    SCHEDULER_NODE_FAILURE,
)
from ..errors import ExecutorError, LedgerError
from ..executor import Executor, JobAccount, JobInfo, make_executor
from ..ledger import Ledger, connect
from ..ledger.heartbeats import heartbeat_time
from ..ledger.schema import Attempt, Run, utcnow
from ..notify.cycle import notify_cycle
from ..reporting.joblogs import job_folder
from . import canary, evaluation_jobs, progress
from .queue import CANARY_JOB_FUNC, EVALUATION_JOB_FUNC, JOB_FUNC, RunQueue
from .settlement import over_allowance, retries_used, settle
from .waves import take_looks

log = logging.getLogger(__name__)

# Failures of a whole service, not of one run: they end a cycle instead of being counted per run.
SERVICE_DOWN = (OperationalError, InterfaceError, RedisConnectionError, RedisTimeoutError)

# A `submitting` attempt younger than this may still be in its worker's hands.
STALE_SUBMITTING = timedelta(seconds=60)


@dataclass
class ReconcileReport:
    polled: int = 0
    ended: int = 0
    started: int = 0
    resolved_submitting: int = 0
    retried: int = 0  # runs lost before the scheduler got them, re-queued under the spec's retries
    requeued: int = 0
    refused_requeues: int = 0
    active: int = 0
    # Runs whose reconcile raised this cycle (logged with the traceback); the others went on.
    errors: int = 0
    heartbeats: int = 0  # new heartbeats copied into the ledger
    looks: int = 0  # looks of sequential designs recorded (control/waves.py)
    executor_calls: dict[str, int] = field(default_factory=dict)


def reconcile(ledger: Ledger, settings: Settings, queues: Sequence[RunQueue], *, actor: str,
              executors: dict[str, Executor] | None = None, stale_after: timedelta = STALE_SUBMITTING) -> ReconcileReport:
    """One reconcile cycle over the runs of `queues` (all queues' attempts if `queues` is empty)."""
    rep = ReconcileReport()
    names = {q.name for q in queues}
    executors = dict(executors or {})
    by_name = {q.name: q for q in queues}
    busy: dict[str, str | None] = {}
    for q in queues:
        busy.update(q.started(alive_only=True))

    active = [(r, a) for r, a in ledger.active_attempts() if not names or settings.queue_for(r.experiment.queue) in names]
    groups: dict[str, list[tuple[Run, Attempt]]] = defaultdict(list)
    for run, att in active:
        groups[att.executor].append((run, att))
    for ex_name, pairs in groups.items():
        ex = executors.get(ex_name)
        if ex is None:
            profile = _profile_of(pairs)
            ex = executors[ex_name] = make_executor(ex_name, jobs_dir=settings.jobs_dir, profile=profile)
        with_id = [(r, a) for r, a in pairs if a.job_id]
        # ONE call for all ids: each job's latest state and every run the scheduler made of it (a
        # requeue under the same job id is a run of its own, booked as its own attempt).
        accounts = ex.accounts([a.job_id for _, a in with_id]) if with_id else {}  # type: ignore[misc]
        rep.executor_calls[ex_name] = rep.executor_calls.get(ex_name, 0) + (1 if with_id else 0)
        rep.polled += len(with_id)
        rep.heartbeats += _copy_heartbeats(ledger, settings, with_id, accounts)
        for run, att in with_id:
            if att.job_id not in accounts:
                continue
            info, segments = accounts[att.job_id].latest, accounts[att.job_id].segments  # type: ignore[index]
            if att.kind == ATTEMPT_KIND_CANARY:  # the canary before a sweep: its run stays held (control/canary.py)
                with _one_run(rep, run.run_key):
                    ended, started = canary.reconcile_attempt(ledger, settings, run, att, info, actor=actor)
                    rep.ended, rep.started = rep.ended + ended, rep.started + started
                continue
            if att.kind == ATTEMPT_KIND_EVALUATION:  # an evaluation after training: its run stays succeeded
                with _one_run(rep, run.run_key):
                    ended, started = evaluation_jobs.reconcile_attempt(ledger, settings, run, att, info, actor=actor)
                    rep.ended, rep.started = rep.ended + ended, rep.started + started
                continue
            with _one_run(rep, run.run_key):
                run, att = _book_requeues(ledger, run, att, segments, actor)
                if not info.final and over_allowance(run):
                    _refuse_requeue(ex, run, att)
                    rep.refused_requeues += 1
                elif info.final:
                    out = settle(ledger, run, att, info, _job_folder(settings, run, att), actor=actor,
                                 settings=settings)
                    rep.ended += 1
                    if out.requeued and settings.queue_for(run.experiment.queue) in by_name:
                        by_name[settings.queue_for(run.experiment.queue)].enqueue([run.run_key], run.priority)
                elif info.state == "RUNNING" and att.state == "submitted":
                    ledger.mark_running(run.run_key, att.number, actor=actor, started_at=info.start)
                    rep.started += 1
        for run, att in pairs:
            if att.job_id or att.state != "submitting":
                continue
            if att.kind == ATTEMPT_KIND_CANARY:
                if run.run_key not in busy and utcnow() - att.created_at >= stale_after:
                    with _one_run(rep, run.run_key):
                        rep.resolved_submitting += canary.resolve_submitting(ledger, settings, ex, run, att,
                                                                             actor=actor)
                continue
            if att.kind == ATTEMPT_KIND_EVALUATION:
                with _one_run(rep, run.run_key):
                    rep.resolved_submitting += evaluation_jobs.resolve_submitting(
                        ledger, settings, ex, run, att, busy=busy, stale_after=stale_after, actor=actor)
                continue
            if run.run_key in busy or utcnow() - att.created_at < stale_after:
                continue  # its worker may still be submitting it
            with _one_run(rep, run.run_key):
                spec = RunSpec.from_dict(run.run_spec)
                folder = attempt_folder(settings.jobs_dir, run.run_key, att.number)
                job_id = ex.find(spec, att.number, folder)
                ledger.resolve_submitting(run.run_key, att.number, job_id=job_id, actor=actor,
                                          reason="worker died while submitting; " + (
                                              f"the scheduler has job {job_id}" if job_id else
                                              "the scheduler never got it"))
                rep.resolved_submitting += 1
                if job_id is None and _retry_lost_submission(ledger, run.run_key, actor,
                                                             by_name.get(settings.queue_for(run.experiment.queue))):
                    rep.retried += 1

    # A wave that has ended gets its look, and the next wave released or the arm's runs cancelled.
    rep.looks = sum(1 for step in take_looks(ledger, settings, actor=actor) if step.look is not None)
    rep.requeued = (_requeue_missing(ledger, settings, queues, ledger.queued_run_keys, JOB_FUNC, "run")
                    + _requeue_missing(ledger, settings, queues, ledger.queued_evaluation_keys, EVALUATION_JOB_FUNC,
                                       "evaluation")
                    + _requeue_missing(ledger, settings, queues, ledger.queued_canary_keys, CANARY_JOB_FUNC, "canary"))
    rep.active = sum(1 for r, a in ledger.active_attempts() if not names or settings.queue_for(r.experiment.queue) in names)
    notify_cycle(ledger, settings)  # what it observed, and the outbox's deliveries: bounded, never raises
    return rep


def _job_folder(settings: Settings, run: Run, att: Attempt) -> Path:
    """The folder a job writes into: a requeued job keeps the folder of the attempt that submitted it."""
    return job_folder(settings.jobs_dir, run, att)


def _copy_heartbeats(ledger: Ledger, settings: Settings, pairs: Sequence[tuple[Run, Attempt]],
                     accounts: Mapping[str, JobAccount]) -> int:
    """Copy the heartbeat of every job the scheduler has running (or has just ended) onto its attempt,
    in one ledger statement: a small file read per live job, no call to the scheduler. Unchanged
    heartbeats, and one older than the attempt (an earlier run of a requeued job), are left out."""
    beats = []
    for run, att in pairs:
        account = accounts.get(att.job_id)  # type: ignore[arg-type]
        if account is None or not (account.latest.state == "RUNNING" or account.latest.final):
            continue
        hb = read_heartbeat(_job_folder(settings, run, att))
        if hb is None:
            continue
        at = heartbeat_time(hb)
        if (att.heartbeat_at is not None and at <= att.heartbeat_at) or (att.started_at and at < att.started_at):
            continue
        beats.append((att.id, hb))
    ledger.record_heartbeats(beats)
    return len(beats)


def _profile_of(pairs: Sequence[tuple[Run, Attempt]]) -> str:
    """The executor profile of a group: that of its first run whose spec reads (a run with a bad
    spec is counted in its own loop body, and must not stop the others)."""
    for run, _att in pairs:
        try:
            return RunSpec.from_dict(run.run_spec).profile
        except Exception:  # noqa: BLE001, S112 (that run's own loop body logs and counts it)
            continue
    return "default"


@contextmanager
def _one_run(rep: ReconcileReport, run_key: str) -> Iterator[None]:
    """One run's share of a cycle: a ledger refusal (another reconciler got there first) is
    logged; a database or Redis outage ends the cycle (the next one retries); anything else is
    counted in `rep.errors` and the other runs go on: one bad run never stops recovery. Its log
    lines name the run (config/logs.py)."""
    try:
        with log_context(run_key=run_key):
            yield
    except LedgerError as exc:
        log.info("reconcile %s: %s", run_key, exc.message)
    except SERVICE_DOWN:
        raise
    except Exception:
        log.exception("reconcile %s: failed; the other runs go on", run_key)
        rep.errors += 1


def _retry_lost_submission(ledger: Ledger, run_key: str, actor: str, queue: RunQueue | None) -> bool:
    """A worker that died before sbatch lost the run to infrastructure, not to training: re-queue
    it when the spec allows infrastructure retries (the lost attempt counts as one, costs 0 GPU-h).
    The dead worker's RQ job still sits in the started registry, so the run would look present to
    `_requeue_missing`; it is replaced by a fresh one here."""
    run = ledger.get_run(run_key)  # as resolve_submitting left it
    used = retries_used(run)
    if run.state != "lost" or used > run.retries_allowed:
        return False
    ledger.requeue(run_key, actor=actor, reason=f"worker died before sbatch; infrastructure retry "
                                                f"{used}/{run.retries_allowed}")
    if queue is not None and not queue.inline:
        queue.forget([run_key])
        queue.enqueue([run_key], run.priority)
    return True


def _book_requeues(ledger: Ledger, run: Run, att: Attempt, segments: Sequence[JobInfo],
                   actor: str) -> tuple[Run, Attempt]:
    """Attempts booked on this job id so far vs the runs Slurm made of it: book each new requeue."""
    booked = sum(1 for a in run.attempts if a.job_id == att.job_id)
    if not booked or len(segments) <= booked:
        return run, att
    while len(segments) > booked:
        seg, nxt = segments[booked - 1], segments[booked]
        att = ledger.book_requeue(run.run_key, att.number, actor=actor, started_at=seg.start, ended_at=seg.end,
                                  elapsed_seconds=seg.elapsed_seconds, gpu_hours_scheduler=seg.gpu_hours,
                                  next_started_at=nxt.start, node_failed=seg.state in SCHEDULER_NODE_FAILURE)
        booked += 1
    run = ledger.get_run(run.run_key)
    return run, run.attempts[-1]


def _refuse_requeue(ex: Executor, run: Run, att: Attempt) -> None:
    """Slurm requeues a job whose node failed as often as it fails; past the spec's allowance the
    requeued job is cancelled (it waits out Slurm's requeue hold first, so before it runs again)
    and settles as cancelled with the run failed (attempts.decide)."""
    log.warning("run %s: job %s requeued past retries = %d; cancelling it", run.run_key, att.job_id,
                run.retries_allowed)
    try:
        ex.cancel(att.job_id)  # type: ignore[arg-type]
    except ExecutorError as exc:  # ended meanwhile: the next cycle books whatever it became
        log.info("reconcile %s: %s", run.run_key, exc.message)


def _requeue_missing(ledger: Ledger, settings: Settings, queues: Sequence[RunQueue],
                     queued: Callable[..., Mapping[str, str] | set[str]], func: str, what: str) -> int:
    """Runs (or evaluations after training: `queued` and `func` say which) queued in the ledger with
    no job on Redis (e.g. after a Redis restart) go back on it."""
    n = 0
    for q in queues:
        if q.inline:
            continue
        # Two id sets, no run or job objects: the work is that of comparing keys, at any backlog.
        waiting = queued(q.name, default_queue=settings.queue)
        # runs carry their priority (a mapping); evaluations after training go on the normal queue
        priority = waiting if isinstance(waiting, Mapping) else dict.fromkeys(waiting, DEFAULT_PRIORITY)
        missing = sorted(set(priority) - q.present())
        if missing:
            q.forget(missing)
            n += q.enqueue_by_priority(((key, priority[key]) for key in missing), func=func)
            log.info("reconcile: re-queued %d %s(s) missing from Redis queue %s", len(missing), what, q.name)
    return n


# Unix seconds at the end of the last reconcile cycle that completed, by any worker or command: what
# the dashboard's `ggpo_last_reconcile_age_seconds` is read from (reporting/ledger_metrics.py).
LAST_RECONCILE_KEY = "ggpo:reconcile:last"


def reconcile_now(settings: Settings, queues: Sequence[str], *, actor: str) -> ReconcileReport:
    """One cycle on a ledger connection of its own (a worker's maintenance, `ggpo-batch reconcile`);
    its seconds counted (common/metrics.py) and its end written to Redis (LAST_RECONCILE_KEY)."""
    ledger = connect(settings.db_url)
    try:
        run_queues = [RunQueue.from_url(settings.redis_url, q) for q in queues]
        with metrics.timed(metrics.RECONCILE_SECONDS, errors=metrics.RECONCILE_FAILURES):
            report = reconcile(ledger, settings, run_queues, actor=actor)
        if run_queues:
            run_queues[0].connection.set(LAST_RECONCILE_KEY, f"{time.time():.3f}")
        return report
    finally:
        ledger.engine.dispose()


def last_reconcile(redis: Any) -> float | None:
    """Unix seconds of the last completed reconcile cycle (LAST_RECONCILE_KEY), or None: never."""
    raw = redis.get(LAST_RECONCILE_KEY)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def wait_settled(settings: Settings, queues: Sequence[str], *, timeout: float, actor: str,
                 interval: float = 1.0) -> int:
    """Reconcile until no attempt of these queues is active; returns how many are still active."""
    deadline = time.monotonic() + timeout
    with progress.task("attempts ended", after=2.0) as shown:
        active = None
        while True:
            report = reconcile_now(settings, queues, actor=actor)
            if report.active == 0 or time.monotonic() > deadline:
                return report.active
            if report.active != active:  # a line when the count changes, not every cycle
                active = report.active
                shown.advance(report.ended, note=f"{active} still active")
            time.sleep(interval)
