"""4 real workers on one queue with 200 runs, a GPU quota, PostgreSQL ledger, the dev Slurm.

Every run must be submitted exactly once (Slurm has one job per run name; the ledger one attempt
per run) and the quota must hold at every moment: a sampling thread reads the ledger's in-flight
GPUs and squeue every 0.2 s. Allocations are submitted held (profile dev-cluster-held) and the
test cancels each after it has waited a moment, so the quota fills and runs defer, and 200
allocations cost no GPU time."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.executor.slurm import SlurmExecutor
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import PROFILES
from tests.support.services import wipe_pg
from tests.support.slurm import cancel_tagged, slurm_jobs
from tests.support.specs import write_spec
from tests.support.workers import WorkerProcess, worker_environment

pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(420)]
RUNS = 200
WORKERS = 4
QUOTA_GPUS = 40  # 10 allocations of 4 GPUs in flight at most
HOLD_S = 0.5     # how long a held allocation waits before the test cancels it


@pytest.fixture
def db_url(pg_url: str):  # type: ignore[no-untyped-def]
    """PostgreSQL only: several workers claiming from one queue is the team setup."""
    wipe_pg(pg_url)
    yield pg_url
    wipe_pg(pg_url)


def _active_slurm_gpus(tag: str) -> int:
    out = run_command(["squeue", "-h", "-t", "PD,CF,R,CG,S", "-o", "%j|%b"])
    return sum(4 for line in out.splitlines() if tag in line.partition("|")[0])


def test_four_workers_200_runs_each_submitted_once_quota_never_exceeded(dev_cluster, ledger, settings, tmp_path,
                                                                       tag):  # type: ignore[no-untyped-def]
    spec = load_spec(write_spec(tmp_path, f"cc-{tag}", seeds=list(range(1, RUNS + 1)), profile="dev-cluster-held",
                                max_gpu_hours=100.0))
    t0 = time.monotonic()
    keys = sorted(r.run_key for r in enqueue_spec(ledger, settings, spec, actor="tester").runs)
    assert len(keys) == RUNS
    queue_name = settings.queue
    stop = threading.Event()
    samples: list[tuple[float, int, int]] = []  # (t, ledger in-flight GPUs, Slurm GPUs of active jobs)
    errors: list[BaseException] = []

    def sample() -> None:
        try:
            while not stop.is_set():
                samples.append((time.monotonic() - t0, ledger.in_flight_gpus(queue_name), _active_slurm_gpus(tag)))
                stop.wait(0.2)
        except BaseException as exc:  # noqa: BLE001  (surfaced below)
            errors.append(exc)

    ex = SlurmExecutor(load_profile("dev-cluster-held", PROFILES), settings.jobs_dir,
                       min_submit_interval_s=0)
    queue = RunQueue.from_url(settings.redis_url, queue_name)

    def release_and_book() -> None:
        """The allocations' side: cancel each held job once it has waited HOLD_S, and reconcile."""
        first_seen: dict[str, float] = {}
        try:
            while not stop.is_set():
                now = time.monotonic()
                out = run_command(["squeue", "-h", "-t", "PD", "-o", "%i|%j"])
                due = []
                for line in out.splitlines():
                    job_id, _, name = line.partition("|")
                    if tag in name:
                        seen = first_seen.setdefault(job_id, now)
                        if now - seen >= HOLD_S:
                            due.append(job_id)
                if due:
                    run_command(["scancel", *due])
                reconcile(ledger, settings, [queue], actor="test-reconcile", executors={"slurm": ex},
                          stale_after=timedelta(seconds=60))
                stop.wait(0.25)
        except BaseException as exc:  # noqa: BLE001  (surfaced below)
            errors.append(exc)

    env = worker_environment(settings, GGPO_QUEUE_GPU_QUOTA=str(QUOTA_GPUS), GGPO_DEFER_SECONDS="1")
    workers = [WorkerProcess(env, tmp_path / f"worker{i}.log", name=f"w{i}-{tag}") for i in range(WORKERS)]
    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=release_and_book, daemon=True)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not errors:
            states = ledger.run_states(ledger.get_run(keys[0]).experiment_id)
            if all(s in ("cancelled", "failed", "lost", "succeeded") for s in states.values()):
                break
            dead = [w for w in workers if w.proc.poll() is not None]
            assert not dead, dead[0].text()[-3000:]
            time.sleep(1)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        for w in workers:
            w.stop()
        cancel_tagged(tag)
    assert not errors, errors
    states = ledger.run_states(ledger.get_run(keys[0]).experiment_id)
    unfinished = {k: s for k, s in states.items() if s != "cancelled"}
    assert not unfinished, f"{len(unfinished)} runs not ended after {elapsed:.0f} s: {list(unfinished.items())[:5]}"

    # exactly once: one Slurm job per run (by name), one attempt per run in the ledger
    jobs = slurm_jobs(tag)
    names = {job_name(k, 1) for k in keys}
    assert set(jobs) == names, (len(jobs), sorted(set(jobs) ^ names)[:5])
    dupes = {n: ids for n, ids in jobs.items() if len(ids) != 1}
    assert not dupes, dupes
    attempts = {k: ledger.get_run(k).attempts for k in keys}
    assert all(len(a) == 1 and a[0].state == "cancelled" for a in attempts.values())
    assert {a[0].job_id for a in attempts.values()} == {i for ids in jobs.values() for i in ids}
    assert sum(a[0].gpu_hours_scheduler or 0.0 for a in attempts.values()) == 0.0  # held: never allocated

    # the quota held at every sample, and it was reached (so runs really deferred)
    worst_ledger = max(s[1] for s in samples)
    worst_slurm = max(s[2] for s in samples)
    assert worst_ledger <= QUOTA_GPUS and worst_slurm <= QUOTA_GPUS, (worst_ledger, worst_slurm)
    deferrals = sum(1 for e in ledger.events(experiment_id=ledger.get_run(keys[0]).experiment_id)
                    if (e.reason or "").startswith("deferred"))
    assert worst_ledger == QUOTA_GPUS and deferrals > 0
    print(f"\n[fault] {WORKERS} workers x {RUNS} runs, quota {QUOTA_GPUS} GPUs: {len(jobs)} Slurm jobs "
          f"(0 duplicates), {sum(len(a) for a in attempts.values())} attempts, {deferrals} deferrals, "
          f"{len(samples)} samples, max in flight ledger {worst_ledger} / Slurm {worst_slurm} GPUs, {elapsed:.0f} s")
