"""Redis restarted empty under a running worker: `reconcile` rebuilds the queue from the ledger,
0 runs lost, 0 duplicates (a run already submitted is not queued again)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from ggpo_batch.common.netutil import free_port
from ggpo_batch.config.settings import load_settings
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.spec.parse import load_spec
from tests.support.waiting import wait_until
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow, pytest.mark.timeout(420)]
RUNS = 2  # one in flight when Redis dies (quota 1 GPU), one queued
SPEC = f"""
schema = 1
[experiment]
name = "redis-restart"
method = "ggpo"
seeds = [{", ".join(str(i) for i in range(1, RUNS + 1))}]
gpus = 1
loop_budget_seconds = 1
executor = "local"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


def _redis(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    for _ in range(100):
        try:
            redis.Redis(port=port).ping()
            return proc
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("private redis-server did not start")


def test_redis_restarted_empty_loses_and_duplicates_nothing(ledger, db_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    if not db_url.startswith("sqlite"):
        pytest.skip("one backend is enough for a Redis fault")
    port = free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_DB_URL=db_url, GGPO_REDIS_URL=redis_url, GGPO_DATA_DIR=str(tmp_path / "data"), GGPO_USER="t",
               GGPO_QUEUE="rr", GGPO_QUEUE_GPU_QUOTA="1", GGPO_DEFER_SECONDS="1")
    settings = load_settings(env)
    spec_path = tmp_path / "s.toml"
    spec_path.write_text(SPEC)
    server = _redis(port)
    worker = None
    try:
        enqueue_spec(ledger, settings, load_spec(spec_path), actor="t")
        worker = WorkerProcess(env, tmp_path / "worker-1.log", name="rr-1")
        wait_until(lambda: any(r.state in ("submitted", "running") for r in ledger.runs()), 60, "a first submission")
        # Redis dies and comes back empty (no persistence): queue, schedule and registries are gone.
        server.kill()
        server.wait()
        # The worker dies, and with it the job it was running: a job left alive would write its
        # deferral into the new, empty Redis once it is back.
        worker.kill()
        server = _redis(port)
        q = RunQueue.from_url(redis_url, "rr")
        assert q.present() == set()
        in_flight = {r.run_key for r in ledger.runs() if r.state in ("submitted", "running")}
        rep = reconcile(ledger, settings, [q], actor="test")
        queued = {r.run_key for r in ledger.runs() if r.state == "queued"}
        assert rep.requeued == len(queued) and q.present() == queued  # in-flight runs are not queued again
        assert in_flight.isdisjoint(q.present())
        t0 = time.monotonic()
        worker = WorkerProcess(env, tmp_path / "worker-2.log", name="rr-2", burst=True)
        worker.proc.wait(timeout=300)
        runs = ledger.runs()
        assert [r.state for r in runs] == ["succeeded"] * RUNS, [(r.run_key, r.state, r.cause) for r in runs]
        assert [len(r.attempts) for r in runs] == [1] * RUNS  # no duplicate submission
        assert len({r.attempts[0].job_id for r in runs}) == RUNS
        print(f"\nRedis restarted empty with {len(in_flight)} run(s) in flight and {len(queued)} queued: "
              f"{rep.requeued} re-queued by reconcile, 0 lost, 0 duplicates; drained in {time.monotonic() - t0:.0f} s")
    finally:
        if worker is not None:
            worker.kill()
        server.kill()
