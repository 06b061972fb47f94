"""The RQ side of a worker: the job that submits one run, and the worker process around it.

The job only submits (ledger row first, then the executor, then the job id into the ledger) and
returns; ending attempts is reconcile's work, which every worker runs as an RQ maintenance task
(under a Redis lock, so one worker per interval does it) and, in burst mode, until its runs end.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rq import Queue, Worker, get_current_job
from rq.job import JobStatus
from rq.scheduler import RQScheduler
from rq.serializers import JSONSerializer

from . import progress
from .allocation import attempt_folder
from .config import Settings, fault_pause, load_settings
from .errors import LedgerError
from .executor import IN_PROCESS_EXECUTORS, make_executor
from .ledger import Ledger, QuotaExceeded, connect
from .ledger.attempts import AttemptPlan
from .ledger.fork_link import ForkLink
from .queue import RunQueue
from .reconcile import reconcile_now, wait_settled
from .runspec import RunSpec
from .settlement import settle_own

log = logging.getLogger(__name__)

RECONCILE_LOCK = "ggpo:reconcile-lock"


def _worker_name() -> str:
    job = get_current_job()
    return (job.worker_name if job is not None and job.worker_name else None) or f"inline@{socket.gethostname()}"


@dataclass
class _WorkerProcess:
    """What a worker opens once and the jobs it forks reuse: its settings, one ledger engine,
    whose schema was checked once, at the worker's start, and (PostgreSQL) the warm connection
    its jobs take in turn."""

    settings: Settings
    ledger: Ledger
    pid: int
    link: ForkLink


_process: _WorkerProcess | None = None  # set by run_worker before it forks any job


def execute_run(run_key: str) -> dict[str, Any]:
    """RQ job: submit one attempt of a queued run. Settings come from the worker's environment."""
    ctx = _process
    if ctx is None:  # inline (memory://) or another RQ worker: open what the job needs, for this job
        settings = load_settings()
        ledger = connect(settings.db_url)
        try:
            return submit_run(ledger, settings, run_key, worker=_worker_name())
        finally:
            ledger.engine.dispose()
    if ctx.pid != os.getpid():  # a forked job: only the connection the worker left for it is ours
        pool = ctx.ledger.engine.pool
        if not ctx.link.shared and (pool.checkedin() or pool.checkedout()):  # type: ignore[attr-defined]
            ctx.ledger.engine.dispose(close=False)
        ctx.pid = os.getpid()
    try:
        return submit_run(ctx.ledger, ctx.settings, run_key, worker=_worker_name())
    finally:
        ctx.link.leave_clean()


def submit_run(ledger: Ledger, settings: Settings, run_key: str, *, worker: str) -> dict[str, Any]:
    """Submit the next attempt of `run_key`, unless the ledger says it is not ours to submit."""
    inline = settings.inline_queue
    chosen: dict[str, Any] = {}  # what `plan` decided, inside the ledger's transaction

    def plan(run_spec: dict[str, Any], experiment_queue: str | None) -> AttemptPlan:
        spec = RunSpec.from_dict(run_spec)
        queue_name = settings.queue_for(experiment_queue)
        quota = (queue_name, settings.queue_gpu_quota) if settings.queue_gpu_quota and not inline else None
        chosen.update(spec=spec, queue=queue_name)
        return AttemptPlan(spec.executor, spec.allocated_gpus, quota)

    try:
        taken = ledger.begin_submission(run_key, actor=settings.user, worker=worker, plan=plan)
    except QuotaExceeded as exc:
        ledger.requeue(run_key, actor=settings.user, reason=f"deferred {settings.defer_seconds} s: {exc.message}")
        RunQueue.from_url(settings.redis_url, chosen["queue"]).defer(run_key, settings.defer_seconds,
                                                                     generation=int(time.time() * 1000))
        return {"run_key": run_key, "deferred": exc.message}
    except LedgerError as exc:  # another worker holds it, or it moved meanwhile: not ours
        log.info("run %s not submitted: %s", run_key, exc.message)
        return {"run_key": run_key, "skipped": exc.message}
    att = taken.attempt
    if att is None:
        log.info("run %s is %s: nothing to submit", run_key, taken.state)
        return {"run_key": run_key, "skipped": taken.state}
    spec: RunSpec = chosen["spec"]
    folder = attempt_folder(settings.jobs_dir, run_key, att.number)
    shown = progress.current()
    if shown is not None:
        shown.note(f"{run_key} attempt {att.number}")
        shown.watch(folder)
    executor = make_executor(spec.executor, jobs_dir=settings.jobs_dir, profile=spec.profile,
                             redis_url=None if inline else settings.redis_url)
    fault_pause(settings, "before_submit")
    # Fence: a work horse outlives its SIGKILLed worker, and reconcile may meanwhile have settled
    # this attempt as lost; submitting now would take an allocation the ledger never books.
    if not _still_ours(ledger, run_key, att.number):
        log.error("run %s attempt %d was settled while this job waited: not submitting", run_key, att.number)
        return {"run_key": run_key, "skipped": "attempt settled by reconcile before sbatch"}
    try:
        # begin_attempt just created this attempt: no job can exist for it (a worker that died after
        # sbatch left its own attempt `submitting`, which reconcile looks up), so no per-job lookup
        job_id = executor.submit(spec, att.number, folder, lookup=False)
    except Exception as exc:
        reason = f"submission refused: {type(exc).__name__}: {exc}"
        ledger.resolve_submitting(run_key, att.number, job_id=None, actor=settings.user, reason=reason[:2000],
                                  state="failed")
        log.error("run %s: %s", run_key, reason)
        return {"run_key": run_key, "failed": reason}
    fault_pause(settings, "after_submit")
    # A debug job has ended inside submit(): its submission and its end are booked in one
    # transaction. Inline (memory://) mode has no reconciler and runs one run at a time: the
    # submission is booked first (the run shows as submitted while it runs), then its end here.
    ended = spec.executor == "debug"
    end = None
    try:
        if ended:
            end = settle_own(ledger, run_key, att.number, executor.wait_final(job_id), folder, actor=settings.user,
                             job_id=job_id)
        else:
            ledger.mark_submitted(run_key, att.number, job_id=job_id, actor=settings.user)
    except LedgerError as exc:  # settled (lost) between the fence and sbatch: give the allocation back
        log.error("run %s: %s; cancelling job %s, which the ledger does not know", run_key, exc.message, job_id)
        executor.cancel(job_id)
        return {"run_key": run_key, "cancelled_unbooked": job_id, "reason": exc.message}
    if inline and not ended:
        end = settle_own(ledger, run_key, att.number, executor.wait_final(job_id), folder, actor=settings.user)
    out: dict[str, Any] = {"run_key": run_key, "attempt": att.number, "job_id": job_id, "executor": spec.executor}
    if end is not None:
        out["state"] = end.attempt_state
        if shown is not None:
            shown.note(f"{run_key} {out['state']}", show=False)  # the caller's advance() shows it
    return out


def _still_ours(ledger: Ledger, run_key: str, number: int) -> bool:
    return ledger.attempt_state(run_key, number) == "submitting"


class SchedulerDyingWithWorker(RQScheduler):
    """RQ's scheduler, whose process ends when its worker's does.

    RQ forks the scheduler from the worker (a `worker --burst` too, at its first maintenance
    cycle). A worker killed with SIGKILL (the OOM killer, a node's cleanup) left it running for
    ever, holding its queues' scheduler lock. This one asks the kernel for SIGTERM, its own graceful
    stop (locks released), when the worker dies (Linux's PR_SET_PDEATHSIG)."""

    def start(self) -> Any:
        self._worker_pid = os.getpid()
        return super().start()

    def work(self) -> None:
        watched = _signal_at_parent_death(signal.SIGTERM)
        if os.getppid() != self._worker_pid:  # the worker died before the request took effect
            self.log.warning("scheduler: its worker is gone; not starting")
            return
        if not watched:  # not Linux: RQ's own behaviour
            self.log.warning("scheduler: this system cannot end it with its worker")
        super().work()


def _signal_at_parent_death(signum: int) -> bool:
    """Have the kernel send `signum` to this process when its parent dies; False where it cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, int(signum), 0, 0, 0) == 0  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return False


class GgpoWorker(Worker):
    """An RQ worker whose maintenance also reconciles the ledger with the executors, and whose
    scheduler process ends with it."""

    def __init__(self, *args: Any, settings: Settings, link: ForkLink, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ggpo_settings = settings
        self.ledger_link = link
        self._horse_status: int | None = None  # the last work horse's wait status

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
        self.ledger_link.before_fork()
        self._horse_status = None
        try:
            return super().execute_job(job, queue)
        finally:
            if self.ledger_link.holding:
                self.ledger_link.after_job(self._horse_status, finished=_finished(job))
            if shown is not None:
                shown.advance(note=f"{job.description or job.id} submitted; {queue.count} waiting")

    def wait_for_horse(self) -> tuple[int | None, int | None, Any]:
        pid, status, rusage = super().wait_for_horse()
        if pid:
            self._horse_status = status
        return pid, status, rusage

    def run_maintenance_tasks(self) -> None:
        super().run_maintenance_tasks()
        lock_ttl = max(5, int(self.maintenance_interval) - 1)
        if not self.connection.set(RECONCILE_LOCK, self.name, nx=True, ex=lock_ttl):
            return
        try:
            reconcile_now(self.ggpo_settings, [q.name for q in self.queues], actor=f"reconcile@{self.name}")
        except Exception:  # a reconcile failure must not kill the worker; the next cycle retries
            self.log.exception("reconcile cycle failed")


def _finished(job: Any) -> bool:
    """Whether RQ recorded the job as finished (not failed, not gone)."""
    try:
        return job.get_status(refresh=True) == JobStatus.FINISHED
    except Exception:  # no such job any more, Redis unreachable: not known to have finished
        return False


def run_worker(settings: Settings, queues: Sequence[str], *, burst: bool, name: str | None = None,
               reconcile_interval: int = 30, settle_timeout: float = 3600.0) -> bool:
    """Work the queues; in burst mode, then wait (reconciling) until this queue's attempts have ended."""
    from .executor.payload import preload_payloads
    from .queue import connect as redis_connect

    global _process
    # `kill -QUIT` prints where the worker and its job (which inherits this) are, every thread.
    faulthandler.register(signal.SIGQUIT, all_threads=True)
    # One engine for the worker and the jobs it forks; schema checked once. Its connections are
    # not pinged when taken from the pool: the link checks the one jobs share before each fork.
    ledger = connect(settings.db_url, pre_ping=False)
    if ledger.queued_executors(queues, default_queue=settings.queue) & IN_PROCESS_EXECUTORS:
        preload_payloads()  # torch, DeepSpeed and the trainer once here, not in every forked job
    _warm(ledger)
    link = ForkLink(ledger.engine)
    _process = _WorkerProcess(settings, ledger, os.getpid(), link)
    conn = redis_connect(settings.redis_url)
    worker = GgpoWorker([Queue(q, connection=conn, serializer=JSONSerializer) for q in queues], connection=conn,
                        serializer=JSONSerializer, name=name, settings=settings, link=link,
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
                         actor=f"reconcile@{worker.name}")
            if not _has_queued_runs(settings, queues) or time.monotonic() > deadline:
                return worked
            shown.note("runs deferred by the quota are due: taking them")
            time.sleep(min(settings.defer_seconds, 5))


def _warm(ledger: Ledger) -> None:
    """Do once, before forking, what every job would otherwise do first: import the executors,
    and rehearse a submission's ledger transitions (rolled back: nothing is kept) so the engine
    has compiled their statements. Each forked job inherits all of it ready (about half of a
    job's own time otherwise)."""
    import submitit  # noqa: F401  (every executor submits through it)

    from .executor import debug, local  # noqa: F401  (the registry imports backends lazily)
    from .ledger import NewRun
    from .ledger.schema import utcnow

    key = "ggpo-worker-rehearsal"
    now = utcnow()
    # the columns settlement books for a job that ended without its record (one compiled UPDATE each)
    end = {"attempt_state": "failed", "run_state": "failed", "reason": key, "started_at": now, "ended_at": now,
           "elapsed_seconds": 0.0, "gpu_hours_job": 0.0, "scheduler_state": "FAILED", "exit_code": "1"}
    with ledger.rehearsal() as twin:
        runs = [NewRun(run_key=f"{key}-{i}", arm="a", seed=i, config_hash="-", run_spec={}) for i in (0, 1)]
        twin.create_experiment(name=key, version=1, method="ggpo", source="spec", spec_hash="-", spec={}, gpus=1,
                               actor=key, runs=runs)
        for i, run in enumerate(runs):  # a debug job (submitted and ended in one transaction), then any other
            att = twin.begin_submission(run.run_key, actor=key, worker=key,
                                        plan=lambda _spec, _queue: AttemptPlan("debug", 1)).attempt
            assert att is not None
            twin.attempt_state(run.run_key, att.number)
            if i == 1:
                twin.mark_submitted(run.run_key, att.number, job_id="0", actor=key)
            twin.settle_attempt(run.run_key, att.number, lambda _run, _att: end, actor=key,
                                job_id="0" if i == 0 else None)
    # The pool is left empty: on SQLite each job opens its own connection (one is never carried
    # across a fork), and on PostgreSQL the link opens the one its jobs share at the first fork.
    ledger.engine.dispose()
    gc.freeze()  # the worker's own objects stay out of every job's garbage collections


def _has_queued_runs(settings: Settings, queues: Sequence[str]) -> bool:
    ledger = _process.ledger if _process is not None else connect(settings.db_url)
    return ledger.count_queued(queues, default_queue=settings.queue) > 0
