"""Runs that span two nodes of the dev Slurm (two slurmd on this host): the tiny model trained by 4
gloo ranks on 2 nodes x 2 GPUs through enqueue, worker and Slurm; a 2-node job preempted. What must
hold: both nodes in the job's NodeList, one torch world across them, and the booked GPU-hours equal
nodes x GPUs per node x elapsed / 3600, which is what Slurm's AllocTRES gres/gpu says too."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ggpo_batch.contracts.accounting import allocated_gpus, gpu_hours
from ggpo_batch.contracts.allocation import attempt_folder, details_path
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.executor.slurm import SlurmExecutor, job_comment
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import PROFILES
from tests.support.slurm import (
    cancel_tagged,
    sacct_gpu_hours,
    signal_preemption,
    wait_for,
    wait_ranks_ready,
)
from tests.support.waiting import reconcile_until_ended

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_exclusive, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(420)]

NODES, GPUS_PER_NODE = 2, 2  # profile dev-cluster-2node: one rank per GPU, 4 ranks in all

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
nodes = 2
gpus = 2
loop_budget_seconds = 2
executor = "slurm"
profile = "dev-cluster-2node"
max_gpu_hours = 1.0
retries = {retries}
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
"""


def _sacct(job_id: str) -> dict[str, str]:
    """NodeList, AllocNodes, AllocTRES, ElapsedRaw of the job's (last) run, as sacct prints them."""
    out = run_command(["sacct", "-X", "-P", "-n", "-j", job_id, "-o", "NodeList,AllocNodes,AllocTRES,ElapsedRaw"])
    nodelist, nodes, tres, elapsed = out.strip().splitlines()[-1].split("|")
    return {"NodeList": nodelist, "AllocNodes": nodes, "AllocTRES": tres, "ElapsedRaw": elapsed}


def _hostnames(nodelist: str) -> list[str]:
    return run_command(["scontrol", "show", "hostnames", nodelist]).split()


def _enqueue(ledger, settings, tmp_path: Path, tag: str, *, retries: int = 0) -> str:  # type: ignore[no-untyped-def]
    p = tmp_path / "two-node.toml"
    p.write_text(SPEC.format(name=f"mn-{tag}", retries=retries))
    [run] = enqueue_spec(ledger, settings, load_spec(p), actor="tester").runs
    return run.run_key


def test_two_node_run_through_enqueue_worker_and_slurm_succeeds_and_books_nodes_x_gpus(
        dev_cluster, ledger, settings, worker_env, tmp_path, tag):  # type: ignore[no-untyped-def]
    from ggpo_batch.control.worker import run_worker

    key = _enqueue(ledger, settings, tmp_path, tag)
    try:
        run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=360)
    finally:
        cancel_tagged(tag)
    run = ledger.get_run(key)
    (att,) = run.attempts
    assert att.state == "succeeded" and run.state == "succeeded", (att.state, att.reason)
    acct = _sacct(att.job_id)
    nodes = _hostnames(acct["NodeList"])
    assert len(nodes) == NODES and len(set(nodes)) == NODES and acct["AllocNodes"] == str(NODES), acct
    slurm_gpus = dict(kv.split("=") for kv in acct["AllocTRES"].split(","))["gres/gpu"]
    assert int(slurm_gpus) == allocated_gpus(NODES, GPUS_PER_NODE) == att.gpus == 4, acct
    # booked = Slurm's AllocTRES x ElapsedRaw = nodes x GPUs per node x elapsed / 3600
    assert att.elapsed_seconds == float(acct["ElapsedRaw"]) and att.elapsed_seconds > 0
    assert [att.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(att.job_id))
    assert att.gpu_hours_scheduler == pytest.approx(NODES * GPUS_PER_NODE * att.elapsed_seconds / 3600)
    # the job's own figure: its record bills the whole allocation's GPUs (nodes x GPUs), from its own clock
    record = run.result
    assert record["timing"]["gpus"] == NODES * GPUS_PER_NODE
    assert att.gpu_hours_job == pytest.approx(gpu_hours(4, record["timing"]["elapsed_seconds"]))
    assert 0 < att.gpu_hours_job <= att.gpu_hours_scheduler
    # one torch world across both nodes: 4 ranks under submitit, every rank holding the same policy
    details = json.loads(details_path(attempt_folder(settings.jobs_dir, key, att.number)).read_text())
    assert details["world_size"] == NODES * GPUS_PER_NODE and details["under_submitit"] is True
    assert len(set(details["rank_policy_sha256"])) == 1 and len(details["rank_policy_sha256"]) == 4
    # its provenance names the allocation's nodes as Slurm gave them, and is booked on the attempt
    assert details["provenance"]["hardware"]["nodes"] == nodes and details["provenance"]["hardware"]["world_size"] == 4
    assert ledger.attempt_provenance([att.id])[att.id]["hardware"]["nodes"] == nodes
    print(f"\n[2 nodes] job {att.job_id} on {nodes}: AllocTRES {acct['AllocTRES']}, {att.elapsed_seconds:.0f} s, "
          f"{att.gpu_hours_scheduler:.5f} GPU-h booked (= {NODES} x {GPUS_PER_NODE} x {att.elapsed_seconds:.0f} / 3600)")


def test_two_node_job_preempted_books_one_attempt_with_its_gpu_hours(
        dev_cluster, ledger, settings, tmp_path, tag):  # type: ignore[no-untyped-def]
    key = _enqueue(ledger, settings, tmp_path, tag, retries=0)
    RunQueue.from_url(settings.redis_url, settings.queue).queue.empty()  # as if a worker had taken it
    profile = load_profile("dev-cluster-2node", PROFILES)
    ex = SlurmExecutor(profile, settings.jobs_dir, min_submit_interval_s=0)
    att = ledger.begin_attempt(key, executor="slurm", gpus=allocated_gpus(NODES, GPUS_PER_NODE), actor="tester",
                               worker="w")
    try:
        job_id = ex.submit_callable(lambda: time.sleep(20), job_name(key, att.number), job_comment(key, att.number),
                                    folder=tmp_path / "job", time=15, requeues=0)
        ledger.mark_submitted(key, att.number, job_id=job_id, actor="tester")
        wait_for(ex, job_id, lambda i: i.state == "RUNNING", 60)
        wait_ranks_ready(tmp_path / "job", job_id, NODES * GPUS_PER_NODE)  # every rank's signal handler
        signal_preemption(job_id)  # as submitit sees a preemption
        queue = RunQueue.from_url(settings.redis_url, settings.queue)
        reconcile_until_ended(ledger, settings, queue, {"slurm": ex}, timeout_s=120)
    finally:
        cancel_tagged(tag)
    run = ledger.get_run(key)
    (booked,) = run.attempts  # no retry allowed: one attempt
    assert booked.state == "preempted" and run.state != "queued", (booked.state, booked.reason, run.state)
    acct = _sacct(job_id)
    assert len(set(_hostnames(acct["NodeList"]))) == NODES, acct
    assert [booked.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(job_id))
    assert booked.gpu_hours_scheduler == pytest.approx(NODES * GPUS_PER_NODE * booked.elapsed_seconds / 3600)
    assert booked.gpu_hours_scheduler > 0
    print(f"\n[2 nodes preempted] job {job_id}: 1 attempt, {booked.gpu_hours_scheduler:.5f} GPU-h "
          f"({acct['AllocTRES']}, {booked.elapsed_seconds:.0f} s)")
