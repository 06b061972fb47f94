"""PostgreSQL stopped for 30 s while a worker writes transitions: the writes wait (retry with
backoff) and none is lost."""

from __future__ import annotations

import threading
import time

import pytest

from ggpo_batch.common.netutil import free_port
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine

from .pgcluster import PrivateCluster

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(180)]
OUTAGE_SECONDS = 30
RUNS = 12


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    try:
        c = PrivateCluster(port=free_port())
        c.start()
    except (FileNotFoundError, OSError) as exc:
        pytest.skip(f"cannot start a private PostgreSQL: {exc}")
    yield c
    c.destroy()


def test_transitions_survive_a_30_second_outage(cluster) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(cluster.url)
    upgrade(engine)
    engine.dispose()
    ledger = connect(cluster.url, retry_seconds=OUTAGE_SECONDS * 3)
    keys = [f"pg-v1-{i}-clean" for i in range(RUNS)]
    ledger.create_experiment(name="pg", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=[NewRun(k, "clean", i, "h", {}) for i, k in enumerate(keys)], queue="q")
    errors: list[BaseException] = []
    slowest = [0.0]

    def work() -> None:
        try:
            for key in keys:
                for step in ("begin", "submit", "run", "finish"):
                    t0 = time.monotonic()
                    if step == "begin":
                        ledger.begin_attempt(key, executor="slurm", gpus=4, actor="w", worker="w1")
                    elif step == "submit":
                        ledger.mark_submitted(key, 1, job_id=f"job-{key}", actor="w")
                    elif step == "run":
                        ledger.mark_running(key, 1, actor="w")
                    else:
                        ledger.mark_finished(key, 1, attempt_state="succeeded", run_state="succeeded", actor="w",
                                             elapsed_seconds=60.0, gpu_hours_job=4 * 60 / 3600)
                    slowest[0] = max(slowest[0], time.monotonic() - t0)
                time.sleep(0.4)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    time.sleep(1.5)
    cluster.stop()
    stopped = time.monotonic()
    time.sleep(OUTAGE_SECONDS)
    cluster.start()
    outage = time.monotonic() - stopped
    t.join(timeout=OUTAGE_SECONDS * 3)
    assert not t.is_alive(), "the worker thread is still waiting"
    assert errors == []
    runs = {r.run_key: r for r in ledger.runs()}
    assert all(runs[k].state == "succeeded" for k in keys)
    events = [e for e in ledger.events() if e.entity in ("run", "attempt")]
    # per run: created, and four attempt + three run transitions (queued->submitted->running->succeeded)
    assert len(events) == RUNS * (1 + 4 + 3)
    assert slowest[0] >= OUTAGE_SECONDS * 0.8, "no transition waited out the outage: the test did not bite"
    print(f"\nPostgreSQL down {outage:.1f} s: {RUNS * 7} transitions, 0 lost, slowest waited {slowest[0]:.1f} s")
    ledger.engine.dispose()
