"""The RQ side of the system: one RQ job per run (job id = run key), on Redis.

Redis holds only work waiting to start; the ledger decides what runs. Jobs carry data (the run
key, serialized as JSON), never a pickled object, and are enqueued without an RQ Retry: retries
are the ledger's business. `memory://` gives an in-process fakeredis whose jobs run inline.

A queue is one RQ queue per run priority (ggpo_batch/contracts/priorities.py): a run waits on the one of its
priority (the ledger's `runs.priority`), and every read here (waiting, positions, presence,
removal) covers all of them.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import socket
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from redis import Redis
from redis.client import Pipeline
from rq import Queue, Worker
from rq.job import Job
from rq.registry import FailedJobRegistry, ScheduledJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from ..config.secrets import redact
from ..config.settings import MEMORY_REDIS
from ..contracts.priorities import DEFAULT_PRIORITY, NORMAL, PRIORITIES, by_priority, rq_queue_name
from ..errors import QueueError
from . import progress

log = logging.getLogger(__name__)

JOB_FUNC = "ggpo_batch.worker.execute_run"
# An evaluation after training: its key (`<run key>-eval_<name>`) is the job id and only argument.
EVALUATION_JOB_FUNC = "ggpo_batch.worker.execute_evaluation"
# The canary before a sweep: its key (`<run key>-canary`) is the job id and only argument.
CANARY_JOB_FUNC = "ggpo_batch.worker.execute_canary"
CHUNK = 500
RESULT_TTL = 7 * 24 * 3600
FAILURE_TTL = 30 * 24 * 3600
# The RQ job only submits (an allocation is waited for by reconcile, not by the job), so an
# hour is generous; RQ's 180 s default is too short for a slow sbatch under load.
JOB_TIMEOUT = 3600

_memory: Redis | None = None


def connect(url: str) -> Redis:
    """A Redis connection for `url` (redis://, rediss://, unix://, or memory://)."""
    global _memory
    if url == MEMORY_REDIS:
        if _memory is None:
            import fakeredis

            _memory = fakeredis.FakeRedis()
        return _memory
    try:
        conn = Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30, health_check_interval=30,
                              **_driver_info())
    except ValueError as exc:
        raise QueueError(f"GGPO_REDIS_URL {redact(url)!r} is not a Redis URL: {exc}") from None
    return conn


@functools.cache
def _driver_info() -> dict[str, object]:
    """redis-py 7 looks its own version up in the package metadata for every new connection, and
    a process that opens many (a worker's reconcile cycles, the dashboard) paid about 1 ms each:
    resolved once here."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # redis < 7.1 reads its version once, at import
        return {}
    return {"driver_info": DriverInfo()}


_DEFERRED_SUFFIX = re.compile(r"-deferred[0-9]+$")


def run_key_of_id(job_id: str) -> str:
    """The run key of an RQ job id: the id itself, or `<run key>-deferred<n>` for a deferral."""
    return _DEFERRED_SUFFIX.sub("", job_id) if "-deferred" in job_id else job_id


class RunQueue:
    """One named queue of runs: an RQ queue per priority (`queue` is the normal one)."""

    def __init__(self, connection: Redis, name: str, *, inline: bool = False) -> None:
        self.connection = connection
        self.name = name
        self.queues = {p: Queue(rq_queue_name(name, p), connection=connection, serializer=JSONSerializer,
                                is_async=not inline) for p in PRIORITIES}
        self.queue = self.queues[NORMAL]

    @classmethod
    def from_url(cls, url: str, name: str) -> RunQueue:
        return cls(connect(url), name, inline=url == MEMORY_REDIS)

    @property
    def inline(self) -> bool:
        return not self.queue.is_async

    def _data(self, run_key: str, job_id: str, func: str = JOB_FUNC) -> object:
        # The run key travels as the job's only argument; the job id may differ (a deferral).
        return Queue.prepare_data(func, args=(run_key,), job_id=job_id, timeout=JOB_TIMEOUT,
                                  result_ttl=RESULT_TTL, failure_ttl=FAILURE_TTL, description=run_key)

    def enqueue(self, run_keys: Sequence[str], priority: str = DEFAULT_PRIORITY, *, func: str = JOB_FUNC) -> int:
        """Put one job per run on the queue of `priority` (in pipelined chunks); returns how many were
        enqueued. `func` EVALUATION_JOB_FUNC: the keys are evaluations' (ggpo_batch/control/evaluations.py)."""
        queue = self.queues[priority]
        if self.inline:  # each job runs now, in this process, one after the other
            with progress.task("runs", total=len(run_keys)) as shown:
                for key in run_keys:
                    queue.enqueue_call(func, args=(key,), job_id=key, timeout=JOB_TIMEOUT,
                                       result_ttl=RESULT_TTL, description=key)
                    shown.watch(None)
                    shown.advance()
            return len(run_keys)
        # Built and sent a chunk at a time in this thread. Building them in a second thread while
        # the ledger wrote (as before) was slower on a shared 2-core machine: the two threads
        # traded the GIL, each wake-up of the ledger's I/O waiting out the builder's switch
        # interval (median ratio to raw RQ, enqueue bench at load 4-7: 0.45-0.48 threaded vs
        # 0.58-0.60 so on PostgreSQL, 0.52-0.56 vs 0.66 on SQLite).
        n = 0
        for i in range(0, len(run_keys), CHUNK):
            chunk = run_keys[i:i + CHUNK]
            with self._chunk(chunk, queue, func) as pipe:
                pipe.execute()
            n += len(chunk)
        return n

    def enqueue_by_priority(self, keys_priorities: Iterable[tuple[str, str]], *, func: str = JOB_FUNC) -> int:
        """`enqueue` of runs (or evaluations) of several priorities, each on its own queue, highest first."""
        return sum(self.enqueue(keys, priority, func=func) for priority, keys in by_priority(keys_priorities).items())

    def _chunk(self, run_keys: Sequence[str], queue: Queue, func: str = JOB_FUNC) -> Pipeline:
        """One pipeline holding the jobs of `run_keys`, not executed: nothing is written yet.

        RQ creates and writes the chunk's first job itself. Every other job is that job's hash
        with its own id, data and description (the chunk's jobs share its timestamps), and one
        RPUSH queues them all: what RQ's `enqueue_many` writes, without its per-job `Job`
        object, status write and push (about twice its rate: the enqueue bench prints both). A test
        compares the two writes field by field, so an RQ release that writes jobs differently
        fails it."""
        pipe = self.connection.pipeline()
        first, rest = run_keys[0], run_keys[1:]
        (job,) = queue.enqueue_many([self._data(first, first, func)], pipeline=pipe)  # type: ignore[list-item]
        if rest:
            encode = self.connection.get_encoder().encode
            template = {name: encode(value) for name, value in job.to_dict().items()}
            dumps = queue.serializer.dumps
            for key in rest:
                fields = template.copy()
                fields["data"] = zlib.compress(dumps((func, None, (key,), {})))  # as Job.data, then to_dict
                fields["description"] = encode(key)
                pipe.hset(Job.key_for(key), mapping=fields)  # type: ignore[arg-type]
            pipe.rpush(queue.key, *rest)
        return pipe

    def defer(self, run_key: str, seconds: int, *, generation: int, priority: str = DEFAULT_PRIORITY,
              func: str = JOB_FUNC) -> str:
        """Re-queue a run (or with EVALUATION_JOB_FUNC an evaluation) on its priority's queue after
        `seconds` (needs a worker started with the scheduler, as ours are)."""
        job_id = f"{run_key}-deferred{int(generation)}"
        self.queues[priority].enqueue_in(timedelta(seconds=seconds), func, run_key, job_id=job_id, job_timeout=JOB_TIMEOUT,
                              result_ttl=RESULT_TTL, failure_ttl=FAILURE_TTL, description=run_key)
        return job_id

    def _jobs(self, ids: Iterable[str]) -> list[Job]:
        ids = list(ids)
        if not ids:
            return []
        jobs = Job.fetch_many(ids, connection=self.connection, serializer=JSONSerializer)
        return [j for j in jobs if j is not None]

    @staticmethod
    def run_key_of(job: Job) -> str:
        return str(job.args[0]) if job.args else job.id

    def _started_ids(self) -> list[str]:
        return [j for q in self.queues.values()
                for j in StartedJobRegistry(q.name, connection=self.connection, serializer=JSONSerializer).get_job_ids()]

    def _scheduled_ids(self) -> list[str]:
        return [j for q in self.queues.values()
                for j in ScheduledJobRegistry(q.name, connection=self.connection, serializer=JSONSerializer)
                .get_job_ids()]

    def _waiting_ids(self) -> list[str]:
        """Every waiting job id, in the order a worker takes them: high, normal, low."""
        return [j for q in self.queues.values() for j in q.get_job_ids()]

    def waiting(self) -> dict[str, int]:
        """Run key -> 1-based position (counting the higher priorities' runs ahead of it), for runs
        waiting on the queue (from the id lists alone)."""
        out: dict[str, int] = {}
        for pos, job_id in enumerate(self._waiting_ids(), start=1):
            out.setdefault(run_key_of_id(job_id), pos)
        return out

    def scheduled(self) -> set[str]:
        """Run keys deferred to a later time (the scheduled registries' ids)."""
        return {run_key_of_id(j) for j in self._scheduled_ids()}

    def started(self, *, alive_only: bool = False) -> dict[str, str | None]:
        """Run key -> worker name, for jobs a worker is executing (with `alive_only`, a live worker).

        A worker SIGKILLed in the middle of a job leaves its job in the started registry until RQ's
        maintenance reaps it (90 s to 11 min, FACTS.md), so liveness is checked on the worker itself.
        """
        out = {self.run_key_of(j): j.worker_name for j in self._jobs(self._started_ids())}
        if alive_only:
            out = {k: w for k, w in out.items() if w and self.worker_alive(w)}
        return out

    def worker_alive(self, name: str) -> bool:
        """Is the RQ worker `name` still there: its process on this host, or a fresh heartbeat elsewhere."""
        w = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=self.connection)
        if w is None:
            return False
        if w.hostname == socket.gethostname() and w.pid:
            try:
                os.kill(w.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True
        beat = w.last_heartbeat
        if beat is None:
            return False
        age = (datetime.now(UTC) - beat.replace(tzinfo=UTC)).total_seconds()
        return age < (w.worker_ttl or 420) + 60

    def failed(self) -> dict[str, str]:
        """Run key -> RQ's failure text (e.g. a work-horse killed by a signal)."""
        ids = [j for q in self.queues.values()
               for j in FailedJobRegistry(q.name, connection=self.connection, serializer=JSONSerializer).get_job_ids()]
        out = {}
        for j in self._jobs(ids):
            info = (j.exc_info or "").strip().splitlines()
            out[self.run_key_of(j)] = info[-1] if info else "failed"
        return out

    def present(self) -> set[str]:
        """Run keys with a job waiting, scheduled or executing: three id lists, no job is fetched."""
        ids = [*self._waiting_ids(), *self._scheduled_ids(), *self._started_ids()]
        return {run_key_of_id(j) for j in ids}

    def forget(self, run_keys: Sequence[str]) -> None:
        """Delete old (failed or finished) job hashes of these runs, before they are enqueued again."""
        for job in self._jobs(run_keys):
            job.delete(remove_from_queue=True)

    def positions(self, run_keys: Iterable[str] | None = None) -> dict[str, dict[str, object]]:
        """Where Redis has these runs (None: every run): `queue_position` (1-based; None if
        deferred), `deferred`, `rq_worker` for a job being executed. Reads the id lists; fetches
        only the executing jobs of these runs (for their worker's name)."""
        keys = set(run_keys) if run_keys is not None else None
        info: dict[str, dict[str, object]] = {}
        if keys is not None and not keys:
            return info

        def wanted(key: str) -> bool:
            return keys is None or key in keys

        if keys is None:  # every run: one read of the whole id lists
            for pos, job_id in enumerate(self._waiting_ids(), start=1):
                key = run_key_of_id(job_id)
                if key not in info:
                    info[key] = {"queue_position": pos, "queue": self.name}
        else:  # a page of runs: Redis finds each id in the lists (LPOS), nothing is transferred
            ordered = sorted(keys)
            with self.connection.pipeline(transaction=False) as pipe:
                for q in self.queues.values():
                    pipe.llen(q.key)
                    for key in ordered:
                        pipe.lpos(q.key, key)
                replies = pipe.execute()
            ahead = 0  # the runs of the higher priorities' queues, taken first
            for i, _q in enumerate(self.queues.values()):
                block = replies[i * (len(ordered) + 1):(i + 1) * (len(ordered) + 1)]
                for key, pos in zip(ordered, block[1:]):
                    if pos is not None and key not in info:
                        info[key] = {"queue_position": ahead + int(pos) + 1, "queue": self.name}
                ahead += int(block[0])
        for job_id in self._scheduled_ids():
            key = run_key_of_id(job_id)
            if wanted(key):
                info.setdefault(key, {"queue_position": None, "queue": self.name, "deferred": True})
        started = [j for j in self._started_ids() if wanted(run_key_of_id(j))]
        for job in self._jobs(started):
            info.setdefault(self.run_key_of(job), {"queue": self.name})["rq_worker"] = job.worker_name
        return info

    def remove(self, run_key: str) -> int:
        """Delete every waiting or scheduled job of a run; returns how many."""
        ids = {*self._waiting_ids(), *self._scheduled_ids()}
        n = 0
        for job in self._jobs(ids):
            if self.run_key_of(job) == run_key:
                job.delete(remove_from_queue=True)
                n += 1
        return n
