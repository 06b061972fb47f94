"""The worker's own process: its jobs run in it, it keeps its heartbeat while they do, and what an
executor starts on its host runs in a process forked for it (executor/forked.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from ggpo_batch.errors import ExecutorError
from ggpo_batch.executor.forked import call_forked
from ggpo_batch.common.rank_client import alive as process_alive  # a zombie is not alive


def test_a_forked_call_returns_what_it_returned_from_another_process() -> None:
    pid, pgid = call_forked(lambda: f"{os.getpid()} {os.getpgid(0)}", own_group=False).split()
    assert int(pid) != os.getpid() and int(pgid) == os.getpgid(0)
    pid, pgid = call_forked(lambda: f"{os.getpid()} {os.getpgid(0)}", own_group=True).split()
    assert int(pgid) == int(pid) != os.getpgid(0)  # a group of its own, which what it starts inherits
    assert call_forked(lambda: "x" * 300_000, own_group=False) == "x" * 300_000  # more than a pipe holds


def test_a_forked_call_raises_what_went_wrong_in_it() -> None:
    def boom() -> str:
        raise ValueError("no such model")

    with pytest.raises(ExecutorError, match="ValueError: no such model"):
        call_forked(boom, own_group=False)
    with pytest.raises(ExecutorError, match="killed by signal 9 without answering"):
        call_forked(lambda: str(os.kill(os.getpid(), signal.SIGKILL)), own_group=False)
    with pytest.raises(ExecutorError, match="exited with code 3 without answering"):
        call_forked(lambda: str(os._exit(3)), own_group=False)


def test_an_interrupted_wait_kills_the_forked_process_first(tmp_path: Path) -> None:
    """The worker's RQ job timeout (SIGALRM, raising in the worker) ends the payload's process too."""
    pid_file = tmp_path / "pid"

    def train() -> str:
        pid_file.write_text(str(os.getpid()))
        time.sleep(60)
        return "done"

    def timeout(_signum: int, _frame: object) -> None:
        raise TimeoutError("job timeout")

    before = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(2)
    try:
        with pytest.raises(TimeoutError):
            call_forked(train, own_group=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    assert not process_alive(int(pid_file.read_text()))


@pytest.mark.redis
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the ledger plays no part
def test_a_job_in_the_worker_keeps_the_worker_and_the_job_alive(settings) -> None:  # type: ignore[no-untyped-def]
    """RQ's SimpleWorker announces one heartbeat for the job's whole timeout (an hour) and none while
    the job runs; this worker announces a short one and renews it every monitoring interval, as
    RQ's forking worker does while it waits for its horse: other hosts judge a worker by it."""
    from rq import Queue
    from rq.serializers import JSONSerializer
    from rq.utils import utcparse

    from ggpo_batch.control.queue import JOB_TIMEOUT
    from ggpo_batch.control.queue import connect as redis_connect
    from ggpo_batch.control.worker import GgpoWorker, _Heartbeat

    conn = redis_connect(settings.redis_url)
    queue = Queue("beat", connection=conn, serializer=JSONSerializer)
    job = queue.enqueue("builtins.len", "x", job_timeout=JOB_TIMEOUT)
    worker = GgpoWorker([queue], connection=conn, serializer=JSONSerializer, settings=settings,
                        job_monitoring_interval=1)
    worker.register_birth()
    try:
        worker.prepare_execution(job)
        assert worker.get_heartbeat_ttl(job) == 1 + 60  # not JOB_TIMEOUT + 60
        first = utcparse(conn.hget(worker.key, "last_heartbeat").decode())
        with _Heartbeat(worker, job):
            time.sleep(2.5)  # the job's work
        beat = utcparse(conn.hget(worker.key, "last_heartbeat").decode())
        assert (beat - first).total_seconds() >= 1.5, (first, beat)
        assert 0 < conn.ttl(worker.key) <= 1 + 60
        assert job.started_job_registry.get_job_ids() == [job.id]
    finally:
        worker.register_death()
