"""What copying heartbeats into the ledger adds to a reconcile cycle (ggpo_batch/control/reconcile.py:
`_copy_heartbeats`): for N running attempts, each with a fresh heartbeat file, the batched copy
(one file read per job, ONE UPDATE statement for all) against a baseline of one ledger transaction
per heartbeat, measured in the same run on a SQLite ledger; and a cycle where no heartbeat changed
(file reads only, no write).

    PYTHONPATH=. .venv/bin/python tools/bench/heartbeat_copy.py [--sizes 100,1000] [--cycles 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from ggpo_batch.config.settings import load_settings
from ggpo_batch.contracts.heartbeat import Heartbeat, read_heartbeat, write_heartbeat
from ggpo_batch.control.reconcile import _copy_heartbeats
from ggpo_batch.executor.base import JobAccount, JobInfo
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.joblogs import job_folder


def setup(root: Path, n: int):  # type: ignore[no-untyped-def]
    settings = load_settings({"GGPO_DATA_DIR": str(root), "GGPO_USER": "bench"})
    engine = make_engine(settings.db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(settings.db_url)
    running_runs(led, "hb", n)
    return settings, led


def running_runs(led, name: str, n: int) -> list[str]:  # type: ignore[no-untyped-def]
    """An experiment `name` of `n` runs, each with a running attempt (a local job); their keys."""
    keys = [f"{name}-v1-{i}-clean" for i in range(n)]
    led.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=name, spec={}, gpus=4,
                          actor="b", runs=[NewRun(run_key=k, arm="clean", seed=i, config_hash="c", run_spec={})
                                           for i, k in enumerate(keys)])
    for k in keys:
        led.begin_attempt(k, executor="local", gpus=4, actor="b", worker="b")
        led.mark_submitted(k, 1, job_id=f"job-{k}", actor="b")
        led.mark_running(k, 1, actor="b")
    return keys


def beat_all(settings, pairs, step: int) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    for run, att in pairs:
        write_heartbeat(job_folder(settings.jobs_dir, run, att), Heartbeat(step, step * 1.0, 2700.0, 0.5, 900.0, now))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000")
    ap.add_argument("--cycles", type=int, default=3)
    args = ap.parse_args()
    print(f"{'jobs':>6} {'batched s':>10} {'per-beat s':>11} {'ratio':>6} {'unchanged s':>12}")
    for n in (int(x) for x in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            settings, led = setup(Path(tmp), n)
            batched, single, unchanged = [], [], []
            step = 0
            for _ in range(args.cycles):
                pairs = led.active_attempts()  # a cycle reads them, as reconcile does
                accounts = {a.job_id: JobAccount(latest=JobInfo(job_id=a.job_id, state="RUNNING"),
                                                 segments=()) for _, a in pairs}
                step += 1
                beat_all(settings, pairs, step)
                t0 = time.perf_counter()
                copied = _copy_heartbeats(led, settings, pairs, accounts)
                batched.append(time.perf_counter() - t0)
                assert copied == n
                pairs = led.active_attempts()
                t0 = time.perf_counter()
                assert _copy_heartbeats(led, settings, pairs, accounts) == 0  # nothing new: no write
                unchanged.append(time.perf_counter() - t0)
                step += 1
                beat_all(settings, pairs, step)
                t0 = time.perf_counter()  # baseline: the same reads, one transaction per heartbeat
                for run, att in pairs:
                    hb = read_heartbeat(job_folder(settings.jobs_dir, run, att))
                    led.record_heartbeats([(att.id, hb)])
                single.append(time.perf_counter() - t0)
            led.engine.dispose()
        b, s, u = statistics.median(batched), statistics.median(single), statistics.median(unchanged)
        print(f"{n:>6} {b:>10.3f} {s:>11.3f} {s / b:>5.1f}x {u:>12.3f}", flush=True)


if __name__ == "__main__":
    main()
