"""The canary before a sweep end to end on the dev Slurm, through `ggpo-batch enqueue` and the real
worker (its reconcile cycles): a canary that passes releases the sweep, whose run then trains; a
planted canary (GGPO_CANARY_FAULT, passed to the job through sbatch's environment) stops a sweep of
4 runs before any is submitted: Slurm has seen the canary's job only, and the runs are cancelled with
its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.contracts.canary_spec import CANARY_FAULT_ENV
from ggpo_batch.contracts.states import CANARY_CANCEL_PREFIX
from tests.support.slurm import cancel_tagged, sacct_gpu_hours, slurm_jobs

pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = {seeds}
gpus = 4
loop_budget_seconds = 1
executor = "slurm"
profile = "dev-cluster-1task"
canary = true
canary_minutes = 5
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[train]
eval_size = 4
[arms.clean]
exposure = "none"
{more}
"""
PAIRED = '[arms.paired]\nexposure = "paired"\nexposed_items = 2\ntemplates = ["train_direct", "train_role"]\n'


def _enqueue(tmp_path: Path, name: str, seeds: list[int], more: str = "") -> dict:  # type: ignore[type-arg]
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    spec = tmp_path / f"{name}.toml"
    spec.write_text(SPEC.format(name=name, seeds=seeds, more=more))
    res = CliRunner().invoke(cli, ["enqueue", str(spec), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["enqueued"] == 0 and len(doc["held"]) == len(doc["runs"]) and len(doc["canaries"]) == 1
    return doc


def test_a_canary_that_passes_releases_the_sweep(  # type: ignore[no-untyped-def]
        dev_cluster, ledger, settings, worker_env, tmp_path: Path, tag: str, monkeypatch) -> None:
    from ggpo_batch.control.worker import run_worker

    monkeypatch.delenv(CANARY_FAULT_ENV, raising=False)
    name = f"canary-ok-{tag}"
    doc = _enqueue(tmp_path, name, [1])
    try:
        run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=600)
    finally:
        cancel_tagged(tag)
    [key] = doc["canaries"]
    c = ledger.canary(key)
    assert c.state == "passed", (c.state, c.reason)
    run = ledger.get_run(c.run.run_key)
    canary_att, train_att = run.attempts
    assert (canary_att.kind, train_att.kind) == ("canary", "training")
    assert run.state == "succeeded", (run.cause, train_att.reason)
    assert canary_att.executor == "slurm" and [canary_att.gpu_hours_scheduler] == pytest.approx(
        sacct_gpu_hours(canary_att.job_id))
    # the canary ran before the run's job was submitted
    assert canary_att.ended_at <= train_att.submitted_at


def test_a_planted_canary_stops_a_sweep_of_four_before_any_run_is_submitted(  # type: ignore[no-untyped-def]
        dev_cluster, ledger, settings, worker_env, tmp_path: Path, tag: str, monkeypatch) -> None:
    from ggpo_batch.control.worker import run_worker

    monkeypatch.setenv(CANARY_FAULT_ENV, "push_skips_layer")  # the sbatch'd job inherits it
    name = f"canary-bad-{tag}"
    doc = _enqueue(tmp_path, name, [1, 2], PAIRED)
    assert len(doc["runs"]) == 4
    try:
        run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=600)
    finally:
        cancel_tagged(tag)
    [key] = doc["canaries"]
    c = ledger.canary(key)
    assert c.state == "failed" and c.reason.startswith("weight_push failed"), (c.state, c.reason)
    runs = [ledger.get_run(r["run_key"]) for r in doc["runs"]]
    assert {r.state for r in runs} == {"cancelled"}
    assert all(r.cause.startswith(CANARY_CANCEL_PREFIX) for r in runs)
    [att] = [a for r in runs for a in r.attempts]  # one attempt in all: the canary's
    assert att.kind == "canary" and att.state == "failed"
    # Slurm saw one job of this experiment: the canary's
    jobs = slurm_jobs(name)
    assert list(jobs.values()) == [{att.job_id}], jobs
