"""A CPU spec through the real queue and worker to a finished attempt; a worker SIGKILLed mid-job."""

from __future__ import annotations

import os
import signal
import socket
import time
from datetime import timedelta
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.contracts.run_record import check_run_record
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.common.rank_client import alive as process_alive  # a zombie is not alive
from ggpo_batch.spec.parse import load_spec
from tests.support.waiting import wait_until
from tests.support.workers import (
    WorkerProcess,
    attempt_logs,
    descendants,
    run_burst_worker,
    worker_environment,
)

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow]  # real worker processes, 5-20 s each

SPEC = """
schema = 1
[experiment]
name = "wk"
method = "ggpo"
seeds = [{seeds}]
gpus = 4
loop_budget_seconds = {budget}
executor = "{executor}"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


def _spec(tmp_path: Path, executor: str, budget: float, seeds: str = "1"):  # type: ignore[no-untyped-def]
    p = tmp_path / "wk.toml"
    p.write_text(SPEC.format(executor=executor, budget=budget, seeds=seeds))
    return load_spec(p)


def test_debug_spec_runs_through_queue_and_worker_to_a_finished_attempt(ledger, settings, worker_env,  # type: ignore[no-untyped-def]
                                                                         tmp_path: Path, db_url: str) -> None:
    # On PostgreSQL three runs: the worker keeps its ledger engine and connection from job to job.
    seeds = "1" if db_url.startswith("sqlite") else "1, 2, 3"
    enqueue_spec(ledger, settings, _spec(tmp_path, "debug", 1, seeds), actor="tester")
    # A real `ggpo-batch worker --burst` process: an RQ worker installs signal handlers and forks
    # each payload, which must never happen inside the test process itself.
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], dict(os.environ), timeout=240,
                            verbose=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    runs = ledger.runs()
    assert [r.state for r in runs] == ["succeeded"] * len(seeds.split(",")), \
        ([(r.run_key, r.state, r.cause) for r in runs], done.stderr.decode()[-4000:],
         [attempt_logs(attempt_folder(settings.jobs_dir, r.run_key, 1)) for r in runs if r.state != "succeeded"])
    run = ledger.get_run("wk-v1-1-clean")
    assert run.state == "succeeded", run.cause
    [att] = run.attempts
    assert att.state == "succeeded" and att.executor == "debug" and att.job_id.startswith("debug-")
    assert check_run_record("1/clean", run.result) == []
    assert att.gpu_hours_job == pytest.approx(run.result["timing"]["allocated_gpu_hours_through_evaluation"])
    assert att.gpu_hours_job == pytest.approx(4 * run.result["timing"]["elapsed_seconds"] / 3600)
    [art] = ledger.artifacts(run_id=run.id)
    assert art.kind == "run_record" and Path(art.path).exists() and len(art.sha256) == 64


def test_a_worker_started_with_a_rendezvous_in_its_environment_gives_its_jobs_their_own(  # type: ignore[no-untyped-def]
        ledger, settings, worker_env, tmp_path: Path, db_url: str) -> None:
    """A worker started from a process that holds a training rendezvous (RANK, MASTER_PORT on a port
    still listened on, as a test process or a shell after a run has it) passed it to every debug job,
    whose lone rank then failed to listen there (EADDRINUSE: full runs of the suite failed this way)."""
    if not db_url.startswith("sqlite"):
        pytest.skip("the rendezvous does not touch the ledger")
    enqueue_spec(ledger, settings, _spec(tmp_path, "debug", 1), actor="tester")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)  # the port someone still listens on
        env = {k: v for k, v in os.environ.items() if k != "GGPO_LONE_RANK_PORT"}
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(held.getsockname()[1]))
        done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], env, timeout=240, verbose=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    run = ledger.get_run("wk-v1-1-clean")
    assert run.state == "succeeded", (run.cause, attempt_logs(attempt_folder(settings.jobs_dir, run.run_key, 1)))
    assert "ignoring the rendezvous in its environment" in done.stderr.decode()


def test_worker_sigkilled_mid_job_marks_the_run_lost_not_retried_not_duplicated(  # type: ignore[no-untyped-def]
        ledger, settings, worker_env, tmp_path: Path, db_url: str) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("one backend is enough for a worker kill")
    enqueue_spec(ledger, settings, _spec(tmp_path, "debug", 60), actor="tester")
    worker = WorkerProcess(dict(os.environ), tmp_path / "worker.log", name="wk-kill", reconcile_interval=30)
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            run = ledger.get_run("wk-v1-1-clean")
            if run.attempts and (Path(settings.jobs_dir) / "wk-v1-1-clean" / "attempt-1").exists():
                break
            time.sleep(0.3)
        else:
            raise AssertionError("the worker never started the run")
        # mid-job: training in the payload's process, forked from the worker for it (polled: on a busy
        # machine the fork comes seconds after the attempt's folder)
        below = wait_until(lambda: b if len(b := descendants(worker.proc.pid)) >= 2 else None, 60,
                           "the scheduler and the payload's process below the worker")
        os.kill(worker.proc.pid, signal.SIGKILL)  # the worker alone, as the OOM killer would
        worker.proc.wait(timeout=30)
        wait_until(lambda: not any(process_alive(p) for p in below), 30, "the payload's process ended with its worker")
    finally:
        worker.kill()
    q = RunQueue.from_url(settings.redis_url, "testq")
    rep = reconcile(ledger, settings, [q], actor="test", stale_after=timedelta(0))
    assert rep.resolved_submitting == 1
    run = ledger.get_run("wk-v1-1-clean")
    assert run.state == "lost" and [a.state for a in run.attempts] == ["lost"]
    assert "worker died" in (run.cause or "")
    again = reconcile(ledger, settings, [q], actor="test", stale_after=timedelta(0))
    assert again.requeued == 0 and again.resolved_submitting == 0
    assert "wk-v1-1-clean" not in q.waiting() and len(ledger.get_run("wk-v1-1-clean").attempts) == 1


def test_the_scheduler_process_ends_with_a_worker_killed_by_sigkill(settings, worker_env, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                      db_url: str) -> None:
    """RQ forks the scheduler from the worker; a worker SIGKILLed (the OOM killer) used to leave it
    running for ever, holding the queue's scheduler lock. Only the worker itself is killed here."""
    import redis

    if not db_url.startswith("sqlite"):
        pytest.skip("the scheduler does not touch the ledger")
    env = worker_environment(settings)
    worker = WorkerProcess(env, tmp_path / "worker.log", name="sched-owner")
    lock = "rq:scheduler-lock:testq"
    conn = redis.Redis.from_url(settings.redis_url)
    try:
        wait_until(lambda: conn.exists(lock) and descendants(worker.proc.pid), 60, "the worker's scheduler")
        [scheduler] = descendants(worker.proc.pid)
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=30)
        wait_until(lambda: not process_alive(scheduler), 30, "the scheduler ended with its worker")
        assert not conn.exists(lock)  # its graceful stop released the lock
    finally:
        worker.kill()
