"""Queue, ledger and the real Slurm together: what a reconcile cycle books, exactly-once after a
worker crash, `ggpo-batch cancel` reaching scancel, and one sacct call however many jobs are active."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.interventions import cancel_runs
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.sacct import Sacct, run_command
from ggpo_batch.executor.slurm import SlurmExecutor, job_comment
from ggpo_batch.spec.parse import load_spec
from tests.support import slurm_jobs as jobs
from tests.support.slurm import (
    CountingRunner,
    release_requeue_hold,
    sacct_gpu_hours,
    signal_preemption,
    wait_ranks_ready,
)
from tests.support.waiting import reconcile_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.redis]

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1, 2, 3]
gpus = 4
loop_budget_seconds = 2
executor = "slurm"
profile = "dev-cluster"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
"""


def enqueue(ledger, settings, tmp_path: Path, tag: str, retries: int = 0) -> list[str]:  # type: ignore[no-untyped-def]
    p = tmp_path / "slurm-e2e.toml"
    p.write_text(SPEC.format(name=f"e2e-{tag}").replace('profile = "dev-cluster"',
                                                         f'profile = "dev-cluster"\nretries = {retries}'))
    res = enqueue_spec(ledger, settings, load_spec(p), actor="tester")
    return sorted(r.run_key for r in res.runs)


@pytest.mark.slow
def test_crash_after_sbatch_then_reconcile_books_sacct_gpu_hours_with_one_sacct_per_cycle(
        dev_cluster, ledger, settings, profile, tmp_path, tag):  # type: ignore[no-untyped-def]
    keys = enqueue(ledger, settings, tmp_path, tag)
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    runner = CountingRunner()
    ex = SlurmExecutor(profile, settings.jobs_dir, sacct=Sacct(runner=runner), runner=runner, min_submit_interval_s=0)
    ids, names = {}, {}
    for key in keys:
        # What the worker does first: the attempt row, before sbatch ...
        att = ledger.begin_attempt(key, executor="slurm", gpus=4, actor="tester", worker="w-dead")
        # ... then sbatch, and then it dies before writing the job id into the ledger.
        names[key] = job_name(key, att.number)
        ids[key] = ex.submit_callable(lambda: time.sleep(3), names[key], job_comment(key, att.number), time=3)
    reports = reconcile_until_ended(ledger, settings, queue, {"slurm": ex})
    assert reports[0].resolved_submitting == 3  # found by name, not lost, not submitted again
    assert ex.sbatch_calls == 3
    for key in keys:
        assert run_command(["squeue", "-h", "-t", "all", "--name", names[key], "-o", "%i"]).split() == [ids[key]]
    # one sacct call per cycle for all active jobs (cycles that polled anything)
    polled = [r for r in reports if r.polled]
    assert polled and all(r.executor_calls["slurm"] == 1 for r in polled)
    assert runner.count("sacct") == len(polled)
    assert max(r.polled for r in polled) == 3
    for key in keys:
        (att,) = ledger.get_run(key).attempts
        assert att.job_id == ids[key] and att.state == "failed"  # no result record: the callable wrote none
        assert [att.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(ids[key]))  # one run of the job
        assert att.gpu_hours_scheduler == pytest.approx(4 * att.elapsed_seconds / 3600) and att.elapsed_seconds >= 3
        assert att.gpu_hours_job == pytest.approx(att.gpu_hours_scheduler)


def test_ggpo_batch_cancel_scancels_the_allocation(dev_cluster, ledger, settings, profile, tmp_path, tag):  # type: ignore[no-untyped-def]
    key = enqueue(ledger, settings, tmp_path, tag)[0]
    ex = SlurmExecutor(profile, settings.jobs_dir, min_submit_interval_s=0)
    att = ledger.begin_attempt(key, executor="slurm", gpus=4, actor="tester", worker="w")
    job_id = ex.submit_callable(lambda: time.sleep(120), job_name(key, att.number), job_comment(key, att.number),
                                time=5)
    ledger.mark_submitted(key, att.number, job_id=job_id, actor="tester")
    [res] = cancel_runs(ledger, settings, [key], actor="bob", reason="wrong arm")
    assert res.cancelled_job == job_id
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    reconcile_until_ended(ledger, settings, queue, {"slurm": ex}, timeout_s=30)
    (att,) = ledger.get_run(key).attempts
    assert att.state == "cancelled" and ledger.get_run(key).state == "cancelled"
    assert ex.poll([job_id])[job_id].state == "CANCELLED"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ggpo_batch.train.run.job") is None,
                    reason="needs the training job (ggpo_batch.train.run.job) for the run's payload")
def test_enqueue_worker_sbatch_four_gpus_finished_attempt_books_sacct_gpu_hours(
        dev_cluster, ledger, settings, worker_env, tmp_path, tag):  # type: ignore[no-untyped-def]
    from ggpo_batch.control.worker import run_worker

    key = enqueue(ledger, settings, tmp_path, tag)[0]
    others = [k for k in enqueue(ledger, settings, tmp_path, tag) if k != key]
    cancel_runs(ledger, settings, others, actor="tester", reason="one run is enough here")
    run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=300)
    run = ledger.get_run(key)
    (att,) = run.attempts
    assert att.executor == "slurm" and att.job_id and att.gpus == 4
    assert att.state == "succeeded" and run.state == "succeeded", (att.state, att.reason)
    assert [att.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(att.job_id))
    # the job's own figure (from its record) is booked beside Slurm's; it misses the job's start-up
    assert att.gpu_hours_job is not None and 0 < att.gpu_hours_job <= att.gpu_hours_scheduler
    assert Sacct().accounts([att.job_id])[att.job_id].latest.alloc_gpus == 4


@pytest.mark.slow
def test_a_requeue_under_the_same_job_id_is_its_own_attempt_with_its_own_gpu_hours(
        dev_cluster, ledger, settings, profile, tmp_path, tag):  # type: ignore[no-untyped-def]
    [key, *_] = enqueue(ledger, settings, tmp_path, tag, retries=1)  # the spec allows the requeue it exercises
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    ex = SlurmExecutor(profile, settings.jobs_dir, min_submit_interval_s=0)
    att = ledger.begin_attempt(key, executor="slurm", gpus=4, actor="tester", worker="w")
    log = tmp_path / "starts.log"
    job_id = ex.submit_callable(jobs.CountingSleeper(6, str(log), first_seconds=60), job_name(key, att.number),
                                job_comment(key, att.number), folder=tmp_path / "job", time=15, requeues=1)
    ledger.mark_submitted(key, att.number, job_id=job_id, actor="tester")
    end = time.monotonic() + 30
    while not log.exists() and time.monotonic() < end:
        time.sleep(0.2)
    wait_ranks_ready(tmp_path / "job", job_id, profile.nodes * profile.gpus_per_node)  # every rank's USR2 handler
    time.sleep(3)  # let the first run hold its allocation long enough to cost something
    signal_preemption(job_id)  # as submitit sees a preemption
    while time.monotonic() < end + 60 and ex.poll([job_id])[job_id].restarts < 1:
        time.sleep(0.5)
    release_requeue_hold(job_id)  # skip the 120 s requeue hold
    reconcile_until_ended(ledger, settings, queue, {"slurm": ex}, timeout_s=120)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["preempted", "failed"]  # no record: the sleeper is not a trainer
    assert {a.job_id for a in run.attempts} == {job_id}
    acc = ex.accounts([job_id])[job_id]
    assert len(acc.segments) == 2
    booked = [a.gpu_hours_scheduler for a in run.attempts]
    assert booked == pytest.approx([s.gpu_hours for s in acc.segments]) and booked[0] > 0
    assert sum(booked) == pytest.approx(acc.gpu_hours)
    print(f"\nrequeued job {job_id}: attempts {[a.number for a in run.attempts]}, GPU-h {booked}")
