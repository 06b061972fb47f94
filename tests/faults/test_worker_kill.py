"""A real `ggpo-batch worker` SIGKILLed (its whole process group) at each
point of a submission, on the dev Slurm: before sbatch, between sbatch and the ledger write, while
the allocation waits (held) and while it runs. Then reconcile. What must hold: Slurm has exactly one
job per run+attempt name (none if sbatch never ran), no run is left unaccounted for, and the run
ends in a state that says what happened, with sacct's GPU-hours booked."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.control.worker import submit_run
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.sacct import Sacct, run_command
from ggpo_batch.executor.slurm import SlurmExecutor
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import PROFILES
from tests.support.slurm import (
    CountingRunner,
    cancel_tagged,
    sacct_gpu_hours,
    slurm_jobs,
    squeue_state,
)
from tests.support.specs import write_spec
from tests.support.waiting import reconcile_until_ended, wait_until
from tests.support.workers import WorkerProcess, worker_environment

pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(300)]
PAUSE = "120"  # far longer than the test waits: the kill always lands inside the pause


@pytest.fixture
def db_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"  # workers on one host: SQLite is the embedded default


# point -> (profile, GGPO_FAULT_PAUSE, expected run state)
POINTS = {
    "before_sbatch": ("dev-cluster-1task", f"before_submit={PAUSE}", "lost"),
    "after_sbatch_before_ledger": ("dev-cluster-1task", f"after_submit={PAUSE}", "succeeded"),
    "allocation_pending": ("dev-cluster-held", "", "succeeded"),
    "allocation_running": ("dev-cluster-1task", "", "succeeded"),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_worker_sigkilled_mid_submission(point, dev_cluster, ledger, settings, tmp_path, tag):  # type: ignore[no-untyped-def]
    profile_name, pause, expected = POINTS[point]
    spec = load_spec(write_spec(tmp_path, f"kill-{tag}", seeds=[1], profile=profile_name))
    [run_key] = [r.run_key for r in enqueue_spec(ledger, settings, spec, actor="tester").runs]
    name = job_name(run_key, 1)
    env = worker_environment(settings, GGPO_FAULT_PAUSE=pause) if pause else worker_environment(settings)
    worker = WorkerProcess(env, tmp_path / "worker.log", name=f"w-{tag}")
    t0 = time.monotonic()
    try:
        if point == "before_sbatch":
            wait_until(lambda: _attempt_state(ledger, run_key) == "submitting", 120, "the attempt row")
            worker.wait_for_log("fault injection: pausing", 30)
        elif point == "after_sbatch_before_ledger":
            wait_until(lambda: slurm_jobs(tag).get(name), 120, "the Slurm job")
            worker.wait_for_log("fault injection: pausing", 30)
            assert _attempt_state(ledger, run_key) == "submitting"  # sbatch done, ledger not told
        else:
            wait_until(lambda: _attempt_state(ledger, run_key) == "submitted", 120, "the ledger's job id")
            job_id = ledger.get_run(run_key).attempts[0].job_id
            want = "PENDING" if point == "allocation_pending" else "RUNNING"
            wait_until(lambda: squeue_state(job_id) == want, 60, f"job {job_id} {want}")
        worker.kill()
        killed_at = time.monotonic() - t0
        if point == "allocation_pending":
            run_command(["scontrol", "release", ledger.get_run(run_key).attempts[0].job_id])

        runner = CountingRunner()
        profile = load_profile(profile_name, PROFILES)
        ex = SlurmExecutor(profile, settings.jobs_dir, sacct=Sacct(runner=runner), runner=runner,
                           min_submit_interval_s=0)
        queue = RunQueue.from_url(settings.redis_url, settings.queue)
        reports = reconcile_until_ended(ledger, settings, queue, {"slurm": ex}, timeout_s=200)
        # The same RQ job delivered again (RQ re-queues an abandoned job when it has a Retry) must
        # not take a second allocation either.
        again = submit_run(ledger, settings, run_key, worker="w-redelivered")
        assert "skipped" in again, again
        assert runner.count("sbatch") == 0

        jobs = slurm_jobs(tag)
        run = ledger.get_run(run_key)
        assert run.state == expected, (run.state, run.cause, [(a.state, a.reason) for a in run.attempts])
        (att,) = run.attempts
        if point == "before_sbatch":
            assert jobs == {}  # sbatch never ran: no allocation anywhere
            assert att.state == "lost" and att.job_id is None and att.gpu_hours_job == 0.0
            assert "the scheduler never got it" in (att.reason or "")
        else:
            assert set(jobs) == {name} and jobs[name] == {att.job_id}, jobs  # exactly one allocation
            assert att.state == "succeeded"
            [gh] = sacct_gpu_hours(att.job_id)
            assert att.gpu_hours_scheduler == pytest.approx(gh) and gh > 0
            assert att.gpu_hours_job is not None and 0 < att.gpu_hours_job <= att.gpu_hours_scheduler
        if point == "after_sbatch_before_ledger":
            assert reports[0].resolved_submitting == 1
        print(f"\n[fault] worker SIGKILL {point}: killed at {killed_at:.1f} s, Slurm jobs for {name}: "
              f"{sum(len(v) for v in jobs.values())}, run {run.state}, attempt {att.state} "
              f"({att.reason or 'ok'}), GPU-h scheduler {att.gpu_hours_scheduler} job {att.gpu_hours_job}, "
              f"settled {time.monotonic() - t0:.1f} s after start")
    finally:
        if worker.proc.poll() is None:
            worker.kill()
        cancel_tagged(tag)


def test_worker_killed_before_sbatch_with_one_retry_runs_again_exactly_once(dev_cluster, ledger, settings, tmp_path,
                                                                             tag):  # type: ignore[no-untyped-def]
    """A worker dying before sbatch is an infrastructure cause: with `retries = 1` reconcile
    re-queues the run (the lost attempt counts, 0 GPU-h) and a second worker runs it once."""
    spec = load_spec(write_spec(tmp_path, f"killr-{tag}", seeds=[1], retries=1))
    [run_key] = [r.run_key for r in enqueue_spec(ledger, settings, spec, actor="tester").runs]
    worker = WorkerProcess(worker_environment(settings, GGPO_FAULT_PAUSE=f"before_submit={PAUSE}"),
                           tmp_path / "worker.log", name=f"w-{tag}")
    second = None
    try:
        wait_until(lambda: _attempt_state(ledger, run_key) == "submitting", 120, "the attempt row")
        worker.wait_for_log("fault injection: pausing", 30)
        worker.kill()
        runner = CountingRunner()
        ex = SlurmExecutor(load_profile("dev-cluster-1task", PROFILES), settings.jobs_dir,
                           sacct=Sacct(runner=runner), runner=runner, min_submit_interval_s=0)
        queue = RunQueue.from_url(settings.redis_url, settings.queue)
        rep = reconcile(ledger, settings, [queue], actor="test", executors={"slurm": ex}, stale_after=timedelta(0))
        run = ledger.get_run(run_key)
        assert (rep.resolved_submitting, rep.retried) == (1, 1), rep
        assert run.state == "queued" and [a.state for a in run.attempts] == ["lost"]
        assert run_key in queue.present() and runner.count("sbatch") == 0

        second = WorkerProcess(worker_environment(settings), tmp_path / "worker2.log", name=f"w2-{tag}")
        wait_until(lambda: ledger.get_run(run_key).state in ("succeeded", "failed", "lost"), 180, "the retried run")
        again = reconcile(ledger, settings, [queue], actor="test", executors={"slurm": ex}, stale_after=timedelta(0))
        run = ledger.get_run(run_key)
        assert run.state == "succeeded", (run.state, run.cause, second.text()[-2000:])
        lost, ok = run.attempts
        assert lost.state == "lost" and lost.gpu_hours_job == 0.0 and lost.job_id is None
        assert ok.state == "succeeded" and again.retried == 0
        jobs = slurm_jobs(tag)
        assert jobs == {job_name(run_key, 2): {ok.job_id}}, jobs  # one allocation, for the second attempt
        print(f"\n[fault] worker SIGKILL before sbatch, retries = 1: attempts {[a.state for a in run.attempts]}, "
              f"Slurm jobs {sum(len(v) for v in jobs.values())}, GPU-h scheduler {ok.gpu_hours_scheduler}")
    finally:
        for w in (worker, second):
            if w is not None and w.proc.poll() is None:
                w.kill()
        cancel_tagged(tag)


def _attempt_state(ledger, run_key: str) -> str | None:  # type: ignore[no-untyped-def]
    run = ledger.get_run(run_key)
    return run.attempts[-1].state if run.attempts else None


def test_a_worker_that_stalled_before_sbatch_does_not_submit_an_attempt_settled_meanwhile(
        dev_cluster, ledger, settings, tmp_path, tag):  # type: ignore[no-untyped-def]
    """A worker stalled before sbatch (stopped, swapped out, cut off from Redis) looks dead to
    another host's reconcile, which settles its attempt lost. When it resumes, it must not take
    an allocation the ledger would never book. The stall is the fault pause; the settling is the
    transition reconcile makes for a dead worker's `submitting` attempt."""
    spec = load_spec(write_spec(tmp_path, f"stall-{tag}", seeds=[1]))
    [run_key] = [r.run_key for r in enqueue_spec(ledger, settings, spec, actor="tester").runs]
    worker = WorkerProcess(worker_environment(settings, GGPO_FAULT_PAUSE="before_submit=6"), tmp_path / "w.log",
                           name=f"w-{tag}")
    try:
        wait_until(lambda: _attempt_state(ledger, run_key) == "submitting", 120, "the attempt row")
        worker.wait_for_log("fault injection: pausing", 30)
        ledger.resolve_submitting(run_key, 1, job_id=None, actor="reconcile@elsewhere",
                                  reason="worker died while submitting; the scheduler never got it")
        worker.wait_for_log("was settled while this job waited: not submitting", 60)
        time.sleep(2)  # sacct/squeue would show a job by now
        assert slurm_jobs(tag) == {}, "the worker took an allocation after its attempt was settled"
        (att,) = ledger.get_run(run_key).attempts
        assert att.state == "lost" and att.job_id is None
        assert worker.proc.poll() is None  # the worker goes on to its next job
        print(f"\n[fault] worker stalled past its attempt's settling: run {ledger.get_run(run_key).state}, "
              f"0 Slurm jobs ({att.reason})")
    finally:
        if worker.proc.poll() is None:
            worker.kill()
        cancel_tagged(tag)
