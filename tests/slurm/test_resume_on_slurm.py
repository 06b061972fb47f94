"""Resume proved on the dev Slurm, each run compared step by step with an uninterrupted twin (loss,
gradient norm, groups to 1e-6; the same counts and tokens; the same trained policy):

- a 2-rank run requeued by `scontrol requeue` mid-run resumes, under the same job id, from the
  run's checkpoint; the ledger books the two runs of the job as two attempts;
- a 2-rank run that reaches its time limit checkpoints before it (its save deadline counted from
  the allocation's start, with the profile's signal delay), and with `continue_on_timeout`
  continues in new allocations (new attempts, each booked with its own GPU-hours) until its loop
  budget, summed over them, is spent.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ggpo_batch.contracts.accounting import gpu_hours
from ggpo_batch.contracts.allocation import attempt_folder, details_path, time_limit_path
from ggpo_batch.contracts.runspec import DEFAULT_MAX_CONTINUATIONS, RunSpec
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.executor.slurm import SlurmExecutor
from ggpo_batch.reporting.status import run_row, state_label
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import PROFILES
from tests.support.slurm import cancel_tagged, release_requeue_hold, sacct_gpu_hours
from tests.support.twins import assert_same_run
from tests.support.waiting import reconcile_until_ended, wait_until

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.train, pytest.mark.slow, pytest.mark.timeout(600)]

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
gpus = 2
loop_budget_seconds = {budget}
executor = "slurm"
profile = "{profile}"
max_gpu_hours = 1.0
retries = {retries}
continue_on_timeout = {cont}
max_continuations = {max_cont}
[overheads]
setup_export_seconds = 30
audit_seconds = 5
evaluation_seconds = 5
[train]
eval_size = 2
{train}
[arms.paired]
exposure = "paired"
exposed_items = 4
templates = ["train_direct", "train_role"]
"""


def _enqueue(ledger, settings, tmp_path: Path, name: str, *, budget: float, profile: str, retries: int = 0,  # type: ignore[no-untyped-def]
             cont: bool = False, max_cont: int = DEFAULT_MAX_CONTINUATIONS, train: str = "") -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(SPEC.format(name=name, budget=budget, profile=profile, retries=retries,
                             cont="true" if cont else "false", max_cont=max_cont, train=train))
    [run] = enqueue_spec(ledger, settings, load_spec(p), actor="tester").runs
    return run.run_key


def _submit_twin(spec: RunSpec, folder: Path) -> tuple[SlurmExecutor, str]:
    """The same run as a job of its own on the dev Slurm, uninterrupted (a 10-minute profile of the
    same node shape): the same environment as the run it is compared with, down to torch's threads."""
    ex = SlurmExecutor(load_profile("dev-cluster-2gpu", PROFILES), folder, min_submit_interval_s=0)
    twin = replace(spec, run_key=f"{spec.run_key}-twin", profile="dev-cluster-2gpu", continue_on_timeout=False)
    return ex, ex.submit(twin, 1, attempt_folder(folder, twin.run_key, 1), lookup=False)


def _twin_result(ex: SlurmExecutor, job_id: str, folder: Path, run_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    info = ex.wait_final(job_id, max_delay=2.0)
    out = attempt_folder(folder, f"{run_key}-twin", 1)
    assert info.state == "COMPLETED", (info, sorted(p.name for p in out.iterdir()))
    return json.loads((out / "record.json").read_text()), json.loads(details_path(out).read_text())


@pytest.mark.slow_reason("two 2-rank DeepSpeed runs on Slurm with a requeue between them")
def test_a_two_rank_run_requeued_by_scontrol_resumes_exactly(dev_cluster, ledger, settings, tmp_path, tag):  # type: ignore[no-untyped-def]
    """About 2 min: the job (~1 min of Slurm, twice the start-up), its twin job alongside it."""
    key = _enqueue(ledger, settings, tmp_path, f"rq-{tag}", budget=600, profile="dev-cluster-2gpu", retries=1,
                   train="max_steps = 10\ncheckpoint_every = 1")
    RunQueue.from_url(settings.redis_url, settings.queue).queue.empty()  # as if a worker had taken it
    run = ledger.get_run(key)
    spec = RunSpec.from_dict(run.run_spec)
    ex = SlurmExecutor(load_profile("dev-cluster-2gpu", PROFILES), settings.jobs_dir, min_submit_interval_s=0)
    att = ledger.begin_attempt(key, executor="slurm", gpus=2, actor="tester", worker="w")
    folder = attempt_folder(settings.jobs_dir, key, att.number)
    try:
        job_id = ex.submit(spec, att.number, folder, lookup=False)
        ledger.mark_submitted(key, att.number, job_id=job_id, actor="tester")
        twin_ex, twin_id = _submit_twin(spec, tmp_path / "twin")
        log = folder / f"{job_id}_0_log.err"
        wait_until(lambda: log.exists() and "step 4 " in log.read_text(errors="replace"), 240, "step 4 in rank 0's log")
        run_command(["scontrol", "requeue", job_id])
        wait_until(lambda: ex.poll([job_id])[job_id].restarts >= 1, 60, "Slurm's record of the requeue")
        release_requeue_hold(job_id)  # skip the 120 s requeue hold
        reconcile_until_ended(ledger, settings, RunQueue.from_url(settings.redis_url, settings.queue), {"slurm": ex},
                              timeout_s=300)
        twin_record, twin_details = _twin_result(twin_ex, twin_id, tmp_path / "twin", key)
    finally:
        cancel_tagged(tag)
    run = ledger.get_run(key)
    assert [a.state for a in run.attempts] == ["preempted", "succeeded"], [(a.state, a.reason) for a in run.attempts]
    assert {a.job_id for a in run.attempts} == {job_id} and run.state == "succeeded"
    details = json.loads(details_path(folder).read_text())  # the requeued job wrote into its first folder
    first, second = details["allocations"]
    assert first["to_step"] >= 4 and second["from_step"] == first["to_step"] and second["to_step"] == 10
    assert_same_run(twin_record, twin_details, run.result, details, steps=10)
    # each run of the job booked on its own attempt: Slurm's figures, and the job's own for the second
    assert [a.gpu_hours_scheduler for a in run.attempts] == pytest.approx(sacct_gpu_hours(job_id))
    assert run.attempts[1].gpu_hours_job == pytest.approx(gpu_hours(2, details["allocation_elapsed_seconds"]))
    print(f"\n[requeue] job {job_id}: resumed at step {second['from_step']} of 10, equal to its twin; "
          f"GPU-h booked {[round(a.gpu_hours_scheduler, 5) for a in run.attempts]}")


# The loop budget of the time-limit test: at least the save deadline (start + 120 s - 30 s), so no
# allocation can hold it all, whatever its start-up took.
LOOP_BUDGET_S = 90
# Continuations the time-limit test allows. On an idle machine the budget takes two allocations (about
# 70 s of loop, then the rest); in a full run on 2 cores, where every Slurm job step competes with the
# other tests' (each step its own scheduling group), start-up took about 50 of each allocation's 90 s
# and four allocations gave 84 s of loop: the default of 3 continuations failed the run by chance.
MAX_CONTINUATIONS = 6


@pytest.mark.slow_reason("waits for a real Slurm time limit: the one continuation test that does, against a 2-rank twin")
@pytest.mark.timeout(1500)  # up to MAX_CONTINUATIONS + 1 allocations of 2 minutes, then the twin
def test_a_two_rank_run_continues_past_its_time_limit_and_equals_its_twin(  # type: ignore[no-untyped-def]
        dev_cluster, ledger, settings, worker_env, tmp_path, tag):
    """Profile dev-cluster-2gpu-2min: a 120 s limit, 30 s signal delay, so the save deadline is 90 s
    after the allocation starts; a 90 s loop budget cannot fit in one allocation. About 4 min: the
    allocations (~70 s, then ~40 s), the worker's resubmission, and the twin after them."""
    from ggpo_batch.control.worker import run_worker

    key = _enqueue(ledger, settings, tmp_path, f"tl-{tag}", budget=LOOP_BUDGET_S, profile="dev-cluster-2gpu-2min", cont=True,
                   max_cont=MAX_CONTINUATIONS)
    t0 = time.monotonic()
    try:
        run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=1200)
    finally:
        cancel_tagged(tag)
    slurm_seconds = time.monotonic() - t0
    run = ledger.get_run(key)
    atts = run.attempts
    assert run.state == "succeeded", (run.cause, [(a.state, a.reason) for a in atts])
    assert len(atts) >= 2 and [a.state for a in atts] == ["timeout"] * (len(atts) - 1) + ["succeeded"]
    assert [a.kind for a in atts] == ["training"] + ["continuation"] * (len(atts) - 1)
    assert len({a.job_id for a in atts}) == len(atts)  # each continuation a new allocation
    for a in atts[:-1]:
        # the job stopped itself before Slurm's limit (exit 76, booked TIMEOUT), with its checkpoint
        raw = run_command(["sacct", "-X", "-P", "-n", "-j", a.job_id, "-o", "State,ExitCode,ElapsedRaw"]).split("|")
        assert raw[0].startswith("FAILED") and raw[1] == "76:0" and int(raw[2]) < 120, raw
        assert a.scheduler_state == "TIMEOUT" and "continued after time limit" in a.reason
        note = json.loads(time_limit_path(attempt_folder(settings.jobs_dir, key, a.number)).read_text())
        assert note["step"] > note["from_step"] and note["loop_seconds"] < LOOP_BUDGET_S
    details = json.loads(details_path(attempt_folder(settings.jobs_dir, key, atts[-1].number)).read_text())
    shares = details["allocations"]
    rec = run.result
    assert len(shares) == len(atts) and rec["budget"]["loop_seconds"] >= LOOP_BUDGET_S
    assert rec["budget"]["loop_seconds"] == pytest.approx(sum(s["loop_seconds"] for s in shares))
    # every allocation on its own attempt, none twice: the job's figures add up to the record's
    assert [a.gpu_hours_job for a in atts] == pytest.approx([gpu_hours(2, s["elapsed_seconds"]) for s in shares])
    assert sum(a.gpu_hours_job for a in atts) == pytest.approx(rec["timing"]["allocated_gpu_hours_through_evaluation"])
    for a in atts:
        assert [a.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(a.job_id))
        assert a.gpu_hours_job <= a.gpu_hours_scheduler + gpu_hours(2, 1.0)  # sacct's ElapsedRaw: whole seconds
    assert state_label(run_row(run)) == f"succeeded, continued after time limit ({len(atts) - 1} of {MAX_CONTINUATIONS})"
    # the twin: the same run uninterrupted, for as many steps as the loop budget gave it
    steps = rec["training"]["counts"]["steps"]
    spec = RunSpec.from_dict(run.run_spec)
    spec = replace(spec, loop_budget_seconds=10_000.0, train={**spec.train, "max_steps": steps})
    try:
        twin_ex, twin_id = _submit_twin(spec, tmp_path / "twin")
        twin_record, twin_details = _twin_result(twin_ex, twin_id, tmp_path / "twin", key)
    finally:
        cancel_tagged(tag)
    assert_same_run(twin_record, twin_details, rec, details, steps=steps)
    print(f"\n[time limit] {len(atts)} allocations {[a.job_id for a in atts]} over {slurm_seconds:.0f} s, "
          f"{steps} steps, loop {rec['budget']['loop_seconds']:.1f} s of {LOOP_BUDGET_S}; equal to its twin")
