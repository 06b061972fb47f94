"""The RQ side of a worker: the job that submits one run, and the worker process around it.

The job only submits (ledger row first, then the executor, then the job id into the ledger) and
returns; ending attempts is reconcile's work, which every worker runs as an RQ maintenance task
(under a Redis lock, so one worker per interval does it) and, in burst mode, until its runs end.

The worker runs each job in its own process, without RQ's fork per job: a job is a few ledger
transitions and one submission, and a forked process paid for its copy-on-write pages and cold
caches most of a job's time (tools/bench/worker_drain.py, PostgreSQL: 0.43 of raw RQ's rate
forking each job, 0.73 forking only the stub payload). What must not run in the worker is a
payload that trains in the calling process (the debug executor's), nor a local job as the
worker's child: those start from a process forked for them (executor/forked.py).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rq import Queue, SimpleWorker, get_current_job
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer
from rq.worker import BaseWorker, WorkerStatus

from ..config.identity import acting
from ..config.logs import bind as bind_log_context
from ..config.logs import log_context
from ..config.settings import Settings, fault_pause, load_settings
from ..contracts.allocation import attempt_folder
from ..contracts.priorities import queue_of, worker_queue_names
from ..contracts.runspec import RunSpec
from ..errors import LedgerError
from ..executor import IN_PROCESS_EXECUTORS, make_executor
from ..ledger import Ledger, QuotaExceeded, connect
from ..ledger.quotas import UserQuota
from ..ledger.submissions import AttemptPlan
from . import progress
from .queue import RunQueue
from .reconcile import reconcile_now, wait_settled
from .rq_scheduler import SchedulerDyingWithWorker
from .settlement import settle_own

log = logging.getLogger(__name__)

RECONCILE_LOCK = "ggpo:reconcile-lock"


def _worker_name() -> str:
    job = get_current_job()
    return (job.worker_name if job is not None and job.worker_name else None) or f"inline@{socket.gethostname()}"


@dataclass
class _WorkerProcess:
    """What a worker opens once and every job it runs reuses: its settings and one ledger engine,
    whose schema was checked once, at the worker's start."""

    settings: Settings
    ledger: Ledger


_process: _WorkerProcess | None = None  # set by run_worker before it takes any job


def execute_run(run_key: str) -> dict[str, Any]:
    """RQ job: submit one attempt of a queued run. Settings come from the worker's environment."""
    return _in_this_worker(submit_run, run_key)


def execute_evaluation(key: str) -> dict[str, Any]:
    """RQ job: submit one attempt of a queued evaluation after training (evaluation_jobs.py)."""
    from .evaluation_jobs import submit_evaluation

    return _in_this_worker(submit_evaluation, key)


def execute_canary(key: str) -> dict[str, Any]:
    """RQ job: submit the canary before a sweep (control/canary.py)."""
    from .canary import submit_canary

    return _in_this_worker(submit_canary, key)


def _in_this_worker(submit: Callable[..., dict[str, Any]], key: str) -> dict[str, Any]:
    """`submit(ledger, settings, key, worker=...)` with the worker's own ledger and settings; its log
    lines name the run (config/logs.py)."""
    ctx = _process
    with log_context(run_key=key):
        if ctx is not None:
            return submit(ctx.ledger, ctx.settings, key, worker=_worker_name())
        # inline (memory://) or another RQ worker: open what the job needs, for this job
        settings = load_settings()
        ledger = connect(settings.db_url)
        try:
            return submit(ledger, as_identified(settings, ledger), key, worker=_worker_name())
        finally:
            ledger.engine.dispose()


def submit_run(ledger: Ledger, settings: Settings, run_key: str, *, worker: str) -> dict[str, Any]:
    """Submit the next attempt of `run_key`, unless the ledger says it is not ours to submit."""
    inline = settings.inline_queue
    chosen: dict[str, Any] = {}  # what `plan` decided, inside the ledger's transaction

    user_quota = (UserQuota(settings.user_gpu_quota, settings.role_gpu_quota)
                  if (settings.user_gpu_quota or settings.role_gpu_quota) and not inline else None)

    def plan(run_spec: dict[str, Any], experiment_queue: str | None) -> AttemptPlan:
        spec = RunSpec.from_dict(run_spec)
        queue_name = settings.queue_for(experiment_queue)
        quota = (queue_name, settings.queue_gpu_quota) if settings.queue_gpu_quota and not inline else None
        chosen.update(spec=spec, queue=queue_name, run_spec=run_spec)
        return AttemptPlan(spec.executor, spec.allocated_gpus, quota, user_quota)

    try:
        taken = ledger.begin_submission(run_key, actor=settings.user, worker=worker, plan=plan)
    except QuotaExceeded as exc:
        ledger.requeue(run_key, actor=settings.user, reason=f"deferred {settings.defer_seconds} s: {exc.message}")
        RunQueue.from_url(settings.redis_url, chosen["queue"]).defer(run_key, settings.defer_seconds,
                                                                     generation=int(time.time() * 1000),
                                                                     priority=exc.priority)
        return {"run_key": run_key, "deferred": exc.message}
    except LedgerError as exc:  # another worker holds it, or it moved meanwhile: not ours
        log.info("run %s not submitted: %s", run_key, exc.message)
        return {"run_key": run_key, "skipped": exc.message}
    att = taken.attempt
    if att is None:
        log.info("run %s is %s: nothing to submit", run_key, taken.state)
        return {"run_key": run_key, "skipped": taken.state}
    bind_log_context(attempt=att.number)
    spec: RunSpec = chosen["spec"]
    folder = attempt_folder(settings.jobs_dir, run_key, att.number)
    shown = progress.current()
    if shown is not None:
        shown.note(f"{run_key} attempt {att.number}")
        shown.watch(folder)
    executor = make_executor(spec.executor, jobs_dir=settings.jobs_dir, profile=spec.profile,
                             redis_url=None if inline else settings.redis_url)
    fault_pause(settings, "before_submit")
    # Fence: a worker that stalled here (stopped, swapped out, cut off from Redis) long enough to
    # look dead may meanwhile have had this attempt settled as lost by another host's reconcile;
    # submitting now would take an allocation the ledger never books.
    if not _still_ours(ledger, run_key, att.number):
        log.error("run %s attempt %d was settled while this job waited: not submitting", run_key, att.number)
        return {"run_key": run_key, "skipped": "attempt settled by reconcile before sbatch"}
    try:
        # begin_attempt just created this attempt: no job can exist for it (a worker that died after
        # sbatch left its own attempt `submitting`, which reconcile looks up), so no per-job lookup
        job_id = executor.submit(spec, att.number, folder, lookup=False, priority=taken.priority)
    except Exception as exc:
        reason = f"submission refused: {type(exc).__name__}: {exc}"
        ledger.resolve_submitting(run_key, att.number, job_id=None, actor=settings.user, reason=reason[:2000],
                                  state="failed")
        log.error("run %s: %s", run_key, reason)
        return {"run_key": run_key, "failed": reason}
    bind_log_context(job_id=job_id)
    fault_pause(settings, "after_submit")
    # A debug job has ended inside submit(): its submission and its end are booked in one
    # transaction. Inline (memory://) mode has no reconciler and runs one run at a time: the
    # submission is booked first (the run shows as submitted while it runs), then its end here.
    ended = spec.executor == "debug"
    end = None
    try:
        if ended:
            end = settle_own(ledger, run_key, att.number, executor.wait_final(job_id), folder, actor=settings.user,
                             job_id=job_id, settings=settings, run_spec=chosen["run_spec"], queue=chosen["queue"])
        else:
            ledger.mark_submitted(run_key, att.number, job_id=job_id, actor=settings.user)
    except LedgerError as exc:  # settled (lost) between the fence and sbatch: give the allocation back
        log.error("run %s: %s; cancelling job %s, which the ledger does not know", run_key, exc.message, job_id)
        executor.cancel(job_id)
        return {"run_key": run_key, "cancelled_unbooked": job_id, "reason": exc.message}
    if inline and not ended:
        end = settle_own(ledger, run_key, att.number, executor.wait_final(job_id), folder, actor=settings.user,
                         settings=settings, run_spec=chosen["run_spec"], queue=chosen["queue"])
    if end is not None and end.continues and not inline:
        # Its next attempt, as reconcile queues a continuation; under its own job id (this job's is
        # still executing), as a deferral does.
        RunQueue.from_url(settings.redis_url, chosen["queue"]).defer(run_key, 1, generation=int(time.time() * 1000))
    out: dict[str, Any] = {"run_key": run_key, "attempt": att.number, "job_id": job_id, "executor": spec.executor}
    if end is not None:
        out["state"] = end.attempt_state
        if shown is not None:
            shown.note(f"{run_key} {out['state']}", show=False)  # the caller's advance() shows it
    return out


def _still_ours(ledger: Ledger, run_key: str, number: int) -> bool:
    return ledger.attempt_state(run_key, number) == "submitting"


class GgpoWorker(SimpleWorker):
    """An RQ worker that runs each job in its own process, keeps its heartbeat while the job runs,
    reconciles the ledger with the executors as its maintenance, and whose scheduler process ends
    with it."""

    def __init__(self, *args: Any, settings: Settings, ggpo_queues: Sequence[str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ggpo_settings = settings
        # its RQ queues are one per priority of each of these
        self.ggpo_queues = list(ggpo_queues) if ggpo_queues is not None else list(
            dict.fromkeys(queue_of(q.name) for q in self.queues))

    # RQ's SimpleWorker announces one heartbeat lasting the job's whole timeout (an hour here); a
    # worker that died in the middle would look alive for that long. Like RQ's forking worker,
    # this one announces a short one and renews it while the job runs (_Heartbeat).
    get_heartbeat_ttl = BaseWorker.get_heartbeat_ttl

    def _start_scheduler(self, *args: Any, **kwargs: Any) -> None:
        # RQ (2.x) builds its scheduler here by the module-level name and, outside burst mode,
        # starts its process at once: this worker's is the one that dies with it. The test of it
        # fails if RQ stops calling this method.
        import rq.worker.base as rq_worker

        rq_worker.RQScheduler = SchedulerDyingWithWorker  # type: ignore[misc]
        try:
            super()._start_scheduler(*args, **kwargs)
        finally:
            rq_worker.RQScheduler = RQScheduler  # type: ignore[misc]

    def execute_job(self, job: Any, queue: Queue) -> Any:
        shown = progress.current()
        if shown is not None:
            shown.note(f"{job.description or job.id}")
        self.prepare_execution(job)
        try:
            with _Heartbeat(self, job):
                self.perform_job(job, queue)
        finally:
            self.set_state(WorkerStatus.IDLE)
            if shown is not None:
                shown.advance(note=f"{job.description or job.id} submitted; {queue.count} waiting")

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        lock_ttl = max(5, int(self.maintenance_interval) - 1)
        if not self.connection.set(RECONCILE_LOCK, self.name, nx=True, ex=lock_ttl):
            return
        try:
            reconcile_now(self.ggpo_settings, self.ggpo_queues,
                          actor=acting(self.ggpo_settings.user, f"reconcile@{self.name}"))
        except Exception:  # a reconcile failure must not kill the worker; the next cycle retries
            self.log.exception("reconcile cycle failed")


class _Heartbeat:
    """Renews the worker's, the job's and its execution's heartbeats every `job_monitoring_interval`
    while a job runs in the worker (a slow sbatch, a debug payload's training), from a thread:
    what RQ's forking worker does while it waits for its work horse. Other hosts' reconcile takes
    a worker whose heartbeat stopped for dead, and settles its `submitting` attempt as lost."""

    def __init__(self, worker: BaseWorker, job: Any) -> None:
        self._worker, self._job = worker, job
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="rq-heartbeat", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._worker.job_monitoring_interval):
            try:
                self._worker.maintain_heartbeats(self._job)
            except Exception as exc:  # Redis away for a moment: the next beat retries
                log.warning("heartbeat not sent: %s", exc)


def run_worker(settings: Settings, queues: Sequence[str], *, burst: bool, name: str | None = None,
               reconcile_interval: int = 30, settle_timeout: float = 3600.0,
               metrics_at: tuple[str, int] | None = None) -> bool:
    """Work the queues; in burst mode, then wait (reconciling) until this queue's attempts have ended.
    `metrics_at` (host, port): serve the worker's /metrics and /healthz there (metrics_port.py)."""
    from .metrics_port import served

    # One engine for the worker's life, schema checked once. Its connections are not pinged when
    # taken from the pool (a round trip per transaction): one that died fails its first statement,
    # and the ledger's retry reconnects.
    ledger = connect(settings.db_url, pre_ping=False)
    with served(metrics_at, engine=ledger.engine, redis_url=settings.redis_url):
        return _work(settings, ledger, queues, burst=burst, name=name, reconcile_interval=reconcile_interval,
                     settle_timeout=settle_timeout)


def forget_rendezvous() -> None:
    """A worker starts jobs; it is no rank of one. A rendezvous in its environment (RANK and
    MASTER_PORT left by a training run in the shell or process that started it) would reach every
    job it forks: a debug job's lone rank then listened on that port, still held by whoever had it
    (EADDRINUSE: every debug run of a worker started from a test process failed that way). Each job
    gets its rendezvous from its executor (the local executor's setup, the Slurm script, a lone
    rank's own free port)."""
    from ..train.run.job import RENDEZVOUS_ENV

    if inherited := {k: os.environ.pop(k) for k in RENDEZVOUS_ENV if k in os.environ}:
        log.info("worker: ignoring the rendezvous in its environment (%s)",
                 ", ".join(f"{k}={v}" for k, v in sorted(inherited.items())))


def _work(settings: Settings, ledger: Ledger, queues: Sequence[str], *, burst: bool, name: str | None,
          reconcile_interval: int, settle_timeout: float) -> bool:
    from ..executor.forked import serve_a_worker
    from ..executor.payload import preload_payloads
    from .queue import connect as redis_connect

    global _process
    # `kill -QUIT` prints where the worker is, every thread (a debug payload's process inherits it).
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    forget_rendezvous()
    settings = as_identified(settings, ledger)  # its transitions are its role's (a service: anyone's)
    serve_a_worker()  # what executors start on this host, they start from a process forked for it
    if ledger.queued_executors(queues, default_queue=settings.queue) & IN_PROCESS_EXECUTORS:
        preload_payloads()  # torch, DeepSpeed and the trainer once here, not in every payload's process
    _process = _WorkerProcess(settings, ledger)
    conn = redis_connect(settings.redis_url)
    worker = GgpoWorker(rq_queues(conn, queues), connection=conn, serializer=JSONSerializer, name=name,
                        settings=settings, ggpo_queues=queues,
                        maintenance_interval=reconcile_interval, worker_ttl=max(35, reconcile_interval + 15))
    if not burst:
        return worker.work(burst=False, with_scheduler=True)
    # Burst: drain, let this queue's attempts end, and go again while runs deferred by the quota
    # are still waiting (each pass moves the ones now due from the schedule to the queue).
    deadline = time.monotonic() + settle_timeout
    worked = False
    with progress.task("worker: runs taken") as shown:
        while True:
            worked = worker.work(burst=True, with_scheduler=True) or worked
            shown.note("queue drained; waiting for the runs to end")
            wait_settled(settings, queues, timeout=max(1.0, deadline - time.monotonic()),
                         actor=acting(settings.user, f"reconcile@{worker.name}"))
            if not _has_queued_runs(settings, queues) or time.monotonic() > deadline:
                return worked
            shown.note("runs deferred by the quota are due: taking them")
            time.sleep(min(settings.defer_seconds, 5))


def rq_queues(conn: Any, queues: Sequence[str]) -> list[Queue]:
    """The RQ queues a worker of `queues` takes jobs from, highest priority first: RQ's default dequeue
    takes the next job from the first of them, in this order, that has one."""
    return [Queue(q, connection=conn, serializer=JSONSerializer) for q in worker_queue_names(queues)]


def as_identified(settings: Settings, ledger: Ledger) -> Settings:
    """`settings` with `user` the identity this process acts as on `ledger` (identity.py): its
    PostgreSQL role or OS user, or whom GGPO_USER names where that identity may act for others."""
    from dataclasses import replace

    from ..config.identity import resolve

    return replace(settings, user=resolve(ledger.engine, settings).user, user_declared=False)


def _has_queued_runs(settings: Settings, queues: Sequence[str]) -> bool:
    ledger = _process.ledger if _process is not None else connect(settings.db_url)
    return (ledger.count_queued(queues, default_queue=settings.queue)
            + ledger.count_queued_evaluations(queues, default_queue=settings.queue)
            + sum(len(ledger.queued_canary_keys(q, default_queue=settings.queue)) for q in queues)) > 0
