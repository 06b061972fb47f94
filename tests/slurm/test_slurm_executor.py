"""The Slurm executor against the real single-node Slurm of slurm/dev-cluster (4 declared GPUs)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
from ggpo_batch.errors import ExecutorError
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.sacct import Sacct, run_command
from ggpo_batch.executor.slurm import SlurmExecutor, job_comment
from tests.support import slurm_jobs as jobs
from tests.support.slurm import (
    CountingRunner,
    cancel_tagged,
    final,
    preempt,
    release_requeue_hold,
    squeue_state,
    wait_for,
    wait_ranks_ready,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slurm


def spec_for(run_key: str) -> RunSpec:
    return RunSpec(run_key=run_key, experiment="slurm-test", experiment_version=1, method="ggpo",
                   arm=ArmSpec(name="clean"), seed=1, gpus=4, loop_budget_seconds=5, executor="slurm",
                   profile="dev-cluster")


def sacct_raw(job_id: str, fields: str, expect: str | None = None) -> list[str]:
    """sacct's own lines for a job; with `expect`, wait (slurmdbd lags a second) until one contains it."""
    end = time.monotonic() + 10
    while True:
        lines = run_command(["sacct", "-X", "-D", "-P", "--noheader", "-j", job_id, "-o", fields]).splitlines()
        if expect is None or any(expect in line for line in lines) or time.monotonic() > end:
            return lines
        time.sleep(0.5)


@pytest.mark.slow
def test_four_gpus_and_gpu_hours_equal_sacct(executor, tag, tmp_path):
    out = tmp_path / "report.txt"
    job_id = executor.submit_callable(lambda: jobs.sleep_then_report(3, str(out)), f"ggpo.{tag}.a0",
                                      f"ggpo:{tag}:0", time=3)
    info = wait_for(executor, job_id, final, 60)
    assert info.state == "COMPLETED", info
    (raw,) = sacct_raw(job_id, "AllocTRES,ElapsedRaw,Comment", expect=f"ggpo:{tag}:0")
    tres, elapsed, comment = raw.split("|")
    assert "gres/gpu=4" in tres.split(",")
    assert comment == f"ggpo:{tag}:0"
    assert info.alloc_gpus == 4 and info.elapsed_seconds == float(elapsed) >= 3
    assert info.gpu_hours == pytest.approx(4 * int(elapsed) / 3600)
    assert info.start is not None and info.end is not None and info.restarts == 0
    cvd, slurm_id, port = out.read_text().splitlines()
    assert cvd == "0,1,2,3" and slurm_id == job_id
    # the ranks' rendezvous port: below the ephemeral range (no client socket holds it); the job id's
    # own unless something listened there (tests/test_rendezvous_port.py)
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert 10000 <= int(port) < ephemeral_low


@pytest.mark.slow
def test_crash_between_sbatch_and_ledger_write_does_not_submit_twice(executor, profile, runner, tag, tmp_path):
    spec = spec_for(f"{tag}/clean")
    # A worker sbatches attempt 0 and dies before writing the job id anywhere.
    first = executor.submit_callable(lambda: time.sleep(20), job_name(spec.run_key, 0), job_comment(spec.run_key, 0),
                                     time=3)
    # A fresh worker (new executor, nothing in memory) is told to submit the same attempt.
    again = SlurmExecutor(profile, tmp_path / "other", sacct=Sacct(runner=runner), runner=runner)
    assert again.find(spec, 0) == first
    assert again.submit(spec, 0, tmp_path / "attempt0") == first
    assert again.sbatch_calls == 0 and executor.sbatch_calls == 1
    names = run_command(["squeue", "-h", "-t", "all", "--name", job_name(spec.run_key, 0), "-o", "%i"]).split()
    assert names == [first]
    assert again.find(spec, 1) is None  # another attempt is another job
    executor.cancel(first)
    wait_for(executor, first, final, 30)
    # once finished, squeue -t all finds it while the controller remembers it, and sacct after that
    assert again.find(spec, 0) == first
    end = time.monotonic() + 10
    while not again.sacct.by_name(job_name(spec.run_key, 0)) and time.monotonic() < end:
        time.sleep(0.5)
    assert list(again.sacct.by_name(job_name(spec.run_key, 0))) == [first]


@pytest.mark.slow
def test_hostile_run_keys_are_sanitised(executor, tag, tmp_path):
    marker = Path(f"/tmp/pwned-{tag}")
    key = f"{tag}/x'\"; touch {marker}; $(touch {marker})`touch {marker}`\nline2"
    name, comment = job_name(key, 0), job_comment(key, 0)
    assert "\n" not in name + comment and "'" not in name + comment and "$" not in comment
    with pytest.raises(ExecutorError, match="characters"):
        executor.submit_callable(lambda: None, key, comment)
    with pytest.raises(ExecutorError, match="characters"):
        executor.submit_callable(lambda: None, name, f"ggpo:{key}:0")
    job_id = executor.submit_callable(lambda: None, name, comment, time=3)
    assert wait_for(executor, job_id, final, 60).state == "COMPLETED"
    (raw,) = sacct_raw(job_id, "JobName,Comment", expect=name)
    assert raw == f"{name}|{comment}"
    assert executor.find_by(name, comment) == job_id
    assert not marker.exists()


@pytest.mark.slow
def test_cancel_via_scancel(executor, tag):
    job_id = executor.submit_callable(lambda: time.sleep(120), f"ggpo.{tag}.a0", f"ggpo:{tag}:0", time=5)
    wait_for(executor, job_id, lambda i: i.state == "RUNNING", 30)
    executor.cancel(job_id)
    info = wait_for(executor, job_id, final, 30)
    assert info.state == "CANCELLED" and info.alloc_gpus == 4
    with pytest.raises(ExecutorError, match="not a Slurm job id"):
        executor.cancel("1; scancel -u root")


class LaggingSacct(CountingRunner):
    """The real commands, but sacct answers nothing while `lagging`: slurmdbd not told of the job yet."""

    lagging = False

    def __call__(self, argv):  # type: ignore[no-untyped-def]
        if self.lagging and argv[0] == "sacct":
            self.argv.append(list(argv))
            return ""
        return super().__call__(argv)


def test_job_that_held_nodes_is_not_final_before_sacct_has_it(dev_cluster, profile, tmp_path, tag):  # type: ignore[no-untyped-def]
    """test_cancel_via_scancel's flake: cancelled before slurmdbd had the job, squeue said CANCELLED
    and the job read final with no allocation (alloc_gpus None: 0 GPU-hours)."""
    runner = LaggingSacct()
    ex = SlurmExecutor(profile, tmp_path / "slurm", sacct=Sacct(runner=runner), runner=runner, min_submit_interval_s=0)
    try:
        job_id = ex.submit_callable(lambda: time.sleep(120), f"ggpo.{tag}.a0", f"ggpo:{tag}:0", time=5)
        wait_for(ex, job_id, lambda i: i.state == "RUNNING", 30)
        runner.lagging = True
        ex.cancel(job_id)
        wait_until(lambda: squeue_state(job_id) == "CANCELLED", 30, "squeue says CANCELLED")
        info = ex.poll([job_id])[job_id]
        assert not info.final and info.state == "RUNNING", info  # ended, allocation not yet accounted
        runner.lagging = False
        info = wait_for(ex, job_id, final, 30)
        assert info.state == "CANCELLED" and info.alloc_gpus == 4 and info.gpu_hours is not None, info
    finally:
        cancel_tagged(tag)


def test_many_active_jobs_one_sacct_call(executor, runner, tag):
    ids = [executor.submit_callable(lambda: None, f"ggpo.{tag}-{i}.a0", f"ggpo:{tag}-{i}:0", time=3,
                                    additional_parameters={"hold": True}) for i in range(6)]
    before = runner.count("sacct"), runner.count("squeue")
    states = executor.poll(ids)
    # one sacct call; ids slurmdbd has not recorded yet cost at most one squeue call together
    assert runner.count("sacct") - before[0] == 1 and runner.count("squeue") - before[1] <= 1
    assert sorted(states) == sorted(ids)
    assert {s.state for s in states.values()} == {"PENDING"}
    for j in ids:
        executor.cancel(j)
    wait_until(lambda: all(squeue_state(j) == "CANCELLED" for j in ids), 30, "the controller's CANCELLED")
    before = runner.count("sacct")
    done = executor.poll(ids)
    assert runner.count("sacct") - before == 1 and len(done) == 6
    assert {s.state for s in done.values()} == {"CANCELLED"}


def test_impossible_request_is_refused_at_submit(executor, tag):
    with pytest.raises(ExecutorError, match="sbatch of .* failed"):
        executor.submit_callable(lambda: None, f"ggpo.{tag}.a0", f"ggpo:{tag}:0", gpus_per_node=5)


@pytest.mark.slow_reason("waits for a real 2-minute Slurm time limit: the one TIMEOUT test of the executor")
@pytest.mark.slow
def test_timeout_ends_timeout_and_is_not_requeued(executor, tag):
    # USR2 comes signal_delay_s (30 s, the profile's) before the limit: judged a timeout, not requeued.
    # Slurm may send it up to 60 s early (its event resolution): a 1-minute limit could signal the
    # job before Python has started and installed submitit's handler (the job then dies FAILED, exit
    # 12 = SIGUSR2), so the limit is 2 minutes: the signal comes 30 s in at the earliest.
    job_id = executor.submit_callable(lambda: time.sleep(600), f"ggpo.{tag}.a0", f"ggpo:{tag}:0",
                                      time=2, requeues=3)
    info = wait_for(executor, job_id, final, 240)
    assert info.state == "TIMEOUT", info
    # sacct's record of the allocation, once slurmdbd has it (polled, not a fixed 3 s)
    again = wait_until(lambda: a if (a := executor.accounts([job_id]).get(job_id)) and a.latest.alloc_gpus else None,
                       60, "sacct's allocation of the timed-out job")
    assert again.latest.state == "TIMEOUT" and again.latest.restarts == 0 and len(again.segments) == 1
    assert again.latest.alloc_gpus == 4 and again.latest.elapsed_seconds >= 120


@pytest.mark.slow
def test_preemption_without_allowance_ends_preempted_not_failed(executor, tag, tmp_path):
    # Rank 0 exits at the signal; the job ends when ranks 1-3 have slept out their 20 s (not 60: that
    # held the allocation a minute for nothing), still well after the signal lands.
    job_id = executor.submit_callable(lambda: time.sleep(20), f"ggpo.{tag}.a0", f"ggpo:{tag}:0", time=15)
    wait_for(executor, job_id, lambda i: i.state == "RUNNING", 30)
    wait_ranks_ready(executor.folder / f"ggpo.{tag}.a0", job_id, 4)  # every rank's signal handler in place
    preempt(job_id)  # a dev-urgent job takes the node: slurmctld signals and ends the job
    info = wait_for(executor, job_id, final, 60)
    assert info.state == "PREEMPTED" and info.restarts == 0 and info.alloc_gpus == 4, info


@pytest.mark.slow
def test_preemption_is_requeued_and_each_run_is_a_segment(executor, tag, tmp_path):
    log = tmp_path / "starts.log"
    # time >= 15 min: submitit judges a signal as preemption (not timeout) before min(0.8 T, T - 10 min)
    job_id = executor.submit_callable(jobs.CountingSleeper(8, str(log), first_seconds=60), f"ggpo.{tag}.a0", f"ggpo:{tag}:0",
                                      time=15, requeues=1)
    wait_for(executor, job_id, lambda i: i.state == "RUNNING", 30)
    # Preempt only once the payload runs, so submitit's handler is in place; under a full suite a
    # task took over 20 s to get there, and the requeue that follows a while more.
    end = time.monotonic() + 90
    while not log.exists() and time.monotonic() < end:
        time.sleep(0.2)
    assert log.exists(), "the job's payload did not start in 90 s"
    preempt(job_id)  # slurmctld's own SIGTERM + USR2, from a dev-urgent job taking the node
    wait_for(executor, job_id, lambda i: i.restarts >= 1 and i.state == "PENDING", 120)
    release_requeue_hold(job_id)  # slurmctld holds a requeued job for 120 s (BeginTime)
    info = wait_for(executor, job_id, lambda i: i.final and i.restarts >= 1, 120)
    assert info.state == "COMPLETED", info
    acc = executor.accounts([job_id])[job_id]
    assert len(acc.segments) == 2 and acc.segments[0].state in ("PENDING", "PREEMPTED")
    assert acc.gpu_hours == pytest.approx(sum(4 * s.elapsed_seconds / 3600 for s in acc.segments))
    assert len(log.read_text().splitlines()) == 2
