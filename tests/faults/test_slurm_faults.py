"""Faults on the Slurm side while allocations run: slurmctld restarted, a real preemption (a job of
the dev cluster's urgent partition takes the node: tests/support/slurm.py `preempt`), a node failing (`scontrol update state=down`), a job cancelled from outside.
What must hold: every attempt is booked with sacct's own GPU-hours (AllocTRES gres/gpu x ElapsedRaw),
and a run is retried only where its spec allows infrastructure retries, each retry its own attempt."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.executor.slurm import SlurmExecutor, job_comment
from ggpo_batch.spec.parse import load_spec
from tests.support import slurm_jobs as jobs
from tests.support.paths import DEV_CLUSTER_STATE, PROFILES
from tests.support.slurm import (
    cancel_tagged,
    preempt,
    release_requeue_hold,
    sacct_gpu_hours,
    slurm_jobs,
    squeue_state,
    wait_ranks_ready,
)
from tests.support.specs import write_spec
from tests.support.waiting import reconcile_until_ended, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_exclusive, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]
CTLD_PIDFILE = DEV_CLUSTER_STATE / "run" / "slurmctld.pid"


@pytest.fixture
def db_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"


@pytest.fixture
def slurm(dev_cluster, tag, tmp_path):  # type: ignore[no-untyped-def]
    ex = SlurmExecutor(load_profile("dev-cluster-1task", PROFILES), tmp_path / "slurm", min_submit_interval_s=0)
    yield ex
    cancel_tagged(tag)


def _runs(ledger, settings, tmp_path, tag, *, seeds, retries):  # type: ignore[no-untyped-def]
    spec = load_spec(write_spec(tmp_path, f"sf-{tag}", seeds=seeds, retries=retries))
    keys = sorted(r.run_key for r in enqueue_spec(ledger, settings, spec, actor="tester").runs)
    RunQueue.from_url(settings.redis_url, settings.queue).queue.empty()  # as if a worker had taken them
    return keys


def _submit(ledger, ex, key, fn, folder, *, requeues: int = 0, node: str | None = None) -> str:  # type: ignore[no-untyped-def]
    """What a worker does for one attempt, with a sleeper for a payload: attempt row, sbatch, job id
    (on `node` only, when given)."""
    att = ledger.begin_attempt(key, executor="slurm", gpus=4, actor="tester", worker="w")
    pin = {"additional_parameters": {"nodelist": node}} if node else {}
    job_id = ex.submit_callable(fn, job_name(key, att.number), job_comment(key, att.number), folder=folder,
                                time=5, requeues=requeues, **pin)
    ledger.mark_submitted(key, att.number, job_id=job_id, actor="tester")
    return job_id


def _assert_booked_as_sacct(ledger, key: str, job_id: str) -> list[float]:  # type: ignore[no-untyped-def]
    run = ledger.get_run(key)
    booked = [a.gpu_hours_scheduler for a in run.attempts]
    assert booked == pytest.approx(sacct_gpu_hours(job_id)), (booked, sacct_gpu_hours(job_id))
    assert all(a.elapsed_seconds is not None and a.ended_at is not None for a in run.attempts)
    return booked


def _ctld_alive() -> bool:
    return subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False).stdout.count("UP") > 0


def test_slurmctld_restarted_while_jobs_run_accounting_still_complete(ledger, settings, slurm, tmp_path, tag):  # type: ignore[no-untyped-def]
    keys = _runs(ledger, settings, tmp_path, tag, seeds=[1, 2], retries=0)
    # Both jobs on one node of 4 GPUs (the dev cluster has two): the first job runs through the
    # controller's outage, the second waits for its GPUs across the restart and runs after it.
    node = run_command(["sinfo", "-h", "-N", "-o", "%N"]).split()[0]
    logs = [tmp_path / f"starts-{i}.log" for i in range(2)]
    ids = {k: _submit(ledger, slurm, k, jobs.CountingSleeper(s, str(log)), tmp_path / k.replace("/", "_"), node=node)
           for k, s, log in zip(keys, (12, 4), logs, strict=True)}
    _running, waiting = keys
    wait_until(logs[0].exists, 30, "the first job's payload started")  # past srun's step creation
    assert squeue_state(ids[waiting]) == "PENDING"
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    pid = int(CTLD_PIDFILE.read_text())
    down_at = time.monotonic()
    subprocess.run(["kill", str(pid)], check=True)
    try:
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 20, "slurmctld stopped")
        # a reconcile cycle with the controller gone: sacct (slurmdbd) still answers, nothing is
        # booked as ended that has not ended, and the cycle does not fail
        rep = reconcile(ledger, settings, [queue], actor="test", executors={"slurm": slurm})
        assert rep.active == 2
        time.sleep(max(0.0, 8 - (time.monotonic() - down_at)))
    finally:
        subprocess.run(["slurmctld"], check=True)
        wait_until(_ctld_alive, 30, "slurmctld back")
    down_s = time.monotonic() - down_at
    reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=90)
    figures = []
    for key, job_id in ids.items():
        run = ledger.get_run(key)
        (att,) = run.attempts
        assert att.scheduler_state == "COMPLETED" and att.job_id == job_id, (att.scheduler_state, att.reason)
        assert att.state == "failed" and "without writing its result record" in (att.reason or "")  # a sleeper
        [gh] = _assert_booked_as_sacct(ledger, key, job_id)
        assert gh > 0 and att.gpu_hours_job == pytest.approx(gh)
        figures.append(f"{job_id}: {att.elapsed_seconds:.0f} s, {gh:.4f} GPU-h")
    assert all(len(log.read_text().splitlines()) == 1 for log in logs)
    print(f"\n[fault] slurmctld down {down_s:.1f} s, one job running and one pending: both booked as sacct says "
          f"({'; '.join(figures)})")


def test_preempted_without_retries_fails_the_run_with_no_new_attempt(ledger, settings, slurm, tmp_path, tag):  # type: ignore[no-untyped-def]
    [key] = _runs(ledger, settings, tmp_path, tag, seeds=[1], retries=0)
    job_id = _submit(ledger, slurm, key, lambda: time.sleep(60), tmp_path / "job", requeues=0)
    wait_until(lambda: squeue_state(job_id) == "RUNNING", 30, "running")
    # the task's handler in place: under a full suite its Python was still starting 3 s after
    # RUNNING, and the SIGTERM killed it (FAILED, exit 15) instead of preempting it
    wait_ranks_ready(tmp_path / "job", job_id, 1)
    time.sleep(3)  # hold the allocation long enough to cost something
    preempt(job_id)
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=60)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["preempted"] and run.state == "failed", run.cause
    assert "PREEMPTED" in (run.cause or "") and "retry" not in (run.cause or "")
    [gh] = _assert_booked_as_sacct(ledger, key, job_id)
    assert gh > 0 and queue.present() == set()  # nothing put back on the queue
    assert slurm_jobs(tag) == {job_name(key, 1): {job_id}}
    print(f"\n[fault] preempted, retries=0: run {run.state} ({run.cause}), 1 attempt, {gh:.4f} GPU-h booked")


def test_cancelled_from_outside_is_not_retried_even_with_retries(ledger, settings, slurm, tmp_path, tag):  # type: ignore[no-untyped-def]
    [key] = _runs(ledger, settings, tmp_path, tag, seeds=[1], retries=1)
    job_id = _submit(ledger, slurm, key, lambda: time.sleep(60), tmp_path / "job", requeues=1)
    wait_until(lambda: squeue_state(job_id) == "RUNNING", 30, "running")
    wait_ranks_ready(tmp_path / "job", job_id, 1)  # cancelled while it runs, not while it starts
    time.sleep(3)  # hold the allocation long enough to cost something
    run_command(["scancel", job_id])  # an operator, not ggpo-batch: the ledger learns it from sacct
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=60)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["cancelled"] and run.state == "cancelled", run.cause
    [gh] = _assert_booked_as_sacct(ledger, key, job_id)
    assert gh > 0 and queue.present() == set()
    print(f"\n[fault] scancel from outside, retries=1: run {run.state}, 1 attempt, {gh:.4f} GPU-h booked")


def test_node_failure_without_retries_is_not_requeued_by_slurm(ledger, settings, slurm, tmp_path, tag):  # type: ignore[no-untyped-def]
    [key] = _runs(ledger, settings, tmp_path, tag, seeds=[1], retries=0)
    job_id = _submit(ledger, slurm, key, lambda: time.sleep(60), tmp_path / "job", requeues=0)
    wait_until(lambda: squeue_state(job_id) == "RUNNING", 30, "running")
    # its step running: RUNNING is the allocation, and under a full suite the batch script had not yet
    # launched step 0 when the node went down (no step for slurmd to be done with)
    wait_ranks_ready(tmp_path / "job", job_id, 1)
    time.sleep(3)  # hold the allocation long enough to cost something
    _node_down_then_back(job_id)
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=60)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["node_fail"] and run.state == "failed", \
        [(a.state, a.reason) for a in run.attempts]
    [gh] = _assert_booked_as_sacct(ledger, key, job_id)  # one run of the job: Slurm did not requeue it
    assert gh > 0 and squeue_state(job_id) == "NODE_FAIL"
    print(f"\n[fault] node failure, retries=0: run {run.state} ({run.cause}), 1 attempt, {gh:.4f} GPU-h booked")


def _node_state(node: str) -> str:
    return run_command(["sinfo", "-h", "-N", "-n", node, "-o", "%T"]).split()[0]  # one line per partition


def _node_of(job_id: str) -> str:
    """The (first) node a running job is on: the dev cluster has two, one slurmd each."""
    return run_command(["squeue", "-h", "-j", job_id, "-o", "%N"]).strip().split(",")[0]


def _slurmd_log(node: str) -> Path:
    return DEV_CLUSTER_STATE / "log" / f"slurmd.{node}.log"  # SlurmdLogFile=.../slurmd.%n.log


def _steps_done(job_id: str, node: str) -> int:
    """How often the node's slurmd has finished step 0 of `job_id` (one line per run of the job)."""
    return _slurmd_log(node).read_text(errors="replace").count(f"[{job_id}.0] done with job")


def _stepds(job_id: str) -> list[int]:
    """The slurmstepd processes still serving `job_id` (each titles itself `slurmstepd: [<job>.<step>]`)."""
    prefix = f"slurmstepd: [{job_id}.".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().startswith(prefix):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


# slurmd's terminate-job handler looks for the job's steps once a second and only then forgets the
# job; until it has, a launch of the requeued job is refused as a duplicate job id and drains the node
SLURMD_FORGETS_S = 3


def _node_down_then_back(job_id: str) -> None:
    """The node fails (its jobs end NODE_FAIL), then comes back once slurmd is done with the job:
    its step finished (submitit's payload ignores SIGTERM until KillWait's SIGKILL), its step daemons
    exited (one lingers after logging "done with job"), and SLURMD_FORGETS_S gone by."""
    node = _node_of(job_id)
    before = _steps_done(job_id, node)
    try:
        run_command(["scontrol", "update", f"nodename={node}", "state=down", "reason=ggpo-fault-test"])
        wait_until(lambda: _steps_done(job_id, node) > before, 30, f"slurmd done with job {job_id}'s step")
        wait_until(lambda: not _stepds(job_id), 30, f"the step daemons of job {job_id} gone")
        time.sleep(SLURMD_FORGETS_S)
    finally:
        def back() -> bool:
            if _node_state(node) in ("idle", "mixed", "allocated"):
                return True
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True,
                           check=False)
            return False

        wait_until(back, 30, "node back", interval=0.5)


# fault -> (what does it to a running job, the first attempt's state)
RETRIED_FAULTS = {
    "preempted": (preempt, "preempted"),
    "node_failure": (_node_down_then_back, "node_fail"),
}


@pytest.mark.parametrize("fault", list(RETRIED_FAULTS))
def test_fault_with_one_retry_is_a_second_attempt_with_its_own_gpu_hours(fault, ledger, settings, slurm, tmp_path,  # type: ignore[no-untyped-def]
                                                                          tag):
    """Slurm requeues the job under the same id; the spec's one retry makes that a second attempt, booked apart."""
    do_fault, first_state = RETRIED_FAULTS[fault]
    [key] = _runs(ledger, settings, tmp_path, tag, seeds=[1], retries=1)
    assert ledger.get_run(key).retries_allowed == 1
    log = tmp_path / "starts.log"
    # the first run sleeps 60 s, so the fault lands while it runs (5 s ended before the preemptor got
    # the node beside three CPU-bound processes); the run after the requeue sleeps 5
    job_id = _submit(ledger, slurm, key, jobs.CountingSleeper(5, str(log), first_seconds=60), tmp_path / "job",
                     requeues=ledger.get_run(key).retries_allowed)
    wait_until(log.exists, 30, "the first run started")
    wait_ranks_ready(tmp_path / "job", job_id, 1)  # a signal before a rank's handler would kill it
    time.sleep(3)  # hold the allocation long enough to cost something
    do_fault(job_id)
    wait_until(lambda: slurm.poll([job_id])[job_id].restarts >= 1, 60, "Slurm requeued the job")
    release_requeue_hold(job_id)  # skip the 120 s requeue hold
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=90)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == [first_state, "failed"], [(a.state, a.reason) for a in run.attempts]
    if fault == "node_failure":
        assert run.attempts[0].scheduler_state == "NODE_FAIL" and "node failure" in (run.attempts[0].reason or "")
    assert {a.job_id for a in run.attempts} == {job_id} and len(log.read_text().splitlines()) == 2
    booked = _assert_booked_as_sacct(ledger, key, job_id)
    assert all(b > 0 for b in booked)
    assert slurm_jobs(tag) == {job_name(key, 1): {job_id}}  # the retry is a requeue, not a second sbatch
    print(f"\n[fault] {fault}, retries=1: attempts {[a.state for a in run.attempts]}, GPU-h each {booked}")


def test_node_failing_twice_with_one_retry_is_not_run_a_third_time(ledger, settings, slurm, tmp_path, tag):  # type: ignore[no-untyped-def]
    """Slurm requeues a job after every node failure; the spec's one retry is all it gets."""
    [key] = _runs(ledger, settings, tmp_path, tag, seeds=[1], retries=1)
    log = tmp_path / "starts.log"
    job_id = _submit(ledger, slurm, key, jobs.CountingSleeper(6, str(log)), tmp_path / "job", requeues=1)
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    for n in (1, 2):
        wait_until(lambda n=n: log.exists() and len(log.read_text().splitlines()) == n, 30, f"run {n} started")
        time.sleep(2)
        _node_down_then_back(job_id)
        wait_until(lambda n=n: slurm.poll([job_id])[job_id].restarts >= n, 60, f"Slurm requeue {n}")
        if n == 1:
            release_requeue_hold(job_id)  # skip the 120 s hold
    reports = reconcile_until_ended(ledger, settings, queue, {"slurm": slurm}, timeout_s=60)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["node_fail", "node_fail", "cancelled"], \
        [(a.state, a.reason) for a in run.attempts]
    assert run.state == "failed" and "past the spec's retries = 1" in (run.cause or ""), run.cause
    assert sum(r.refused_requeues for r in reports) >= 1
    assert len(log.read_text().splitlines()) == 2  # two allocations ran, never a third
    booked = [a.gpu_hours_scheduler or 0.0 for a in run.attempts]
    assert booked == pytest.approx(sacct_gpu_hours(job_id)) and booked[0] > 0 and booked[1] > 0 and booked[2] == 0
    print(f"\n[fault] node failing twice, retries=1: attempts {[a.state for a in run.attempts]}, run {run.state}, "
          f"third run refused before it started, GPU-h each {booked}")
