"""`ggpo-batch train`: one run, directly, outside the queue and the ledger."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import click

from ..contracts.allocation import attempt_folder, record_path
from ..executor import EXECUTOR_NAMES
from .app import App, cli, pass_app


@cli.command()
@click.argument("spec_file", metavar="SPEC", type=click.Path(path_type=str))
@click.option("--arm", required=True, help="Arm of the spec to train (with its [arms.ARM.train] overrides, or its "
              "point of the [sweep]).")
@click.option("--seed", required=True, type=int, help="Seed (one of the spec's).")
@click.option("--budget-seconds", type=click.FloatRange(min=0, min_open=True),
              help="Override the spec's loop-time budget.")
@click.option("--executor", type=click.Choice(EXECUTOR_NAMES), default="local", show_default=True,
              help="local: CPU ranks on this machine; slurm: one allocation from the spec's profile.")
@click.option("--nproc", default=2, show_default=True, type=click.IntRange(1, 64), help="Ranks for --executor local.")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where the result record (seed-000 schema) is written.")
@pass_app
def train(app: App, spec_file: str, arm: str, seed: int, budget_seconds: float | None, executor: str, nproc: int,
          output: Path) -> None:
    """Train one arm x seed run of SPEC and write its result record; nothing goes to the queue or ledger.

    The record is the one a queued run stores: training counts and token cost, the loop-budget
    reconciliation, and GPU accounting through evaluation (gpus x elapsed / 3600).
    """
    import dataclasses

    from ..contracts.arm_train import arm_changes, changes_text
    from ..spec.parse import load_spec
    from ..spec.preflight import require

    spec = load_spec(spec_file)
    for default in spec.defaults:  # taken from the model, not written in the spec
        click.echo(f"default: {default}", err=True)
    if seed not in spec.seeds:
        raise click.BadParameter(f"{seed} is not a seed of {spec_file} ({list(spec.seeds)})", param_hint="--seed")
    # The executor this command uses decides the ranks and whether there are GPUs to check.
    require(dataclasses.replace(spec, executor=executor), arms=[arm], ranks=nproc if executor == "local" else None)
    run = spec.run_spec(spec.arm(arm), seed, version=0)  # its train: the spec's with the arm's overrides
    changed = arm_changes(spec.canonical(), arm, spec.baseline_arm)
    if changed:
        click.echo(f"arm {arm} changes against the baseline {spec.baseline_arm!r}: {changes_text(changed)}", err=True)
    if budget_seconds is not None:
        run = dataclasses.replace(run, loop_budget_seconds=float(budget_seconds))
    run = dataclasses.replace(run, executor=executor)
    t0 = time.monotonic()
    click.echo(f"training {run.run_key} ({executor}, budget {run.loop_budget_seconds:g} s) -> {output}", err=True)
    if executor == "local":
        from ..train.run.launch import train_local

        record = train_local(run, output, nproc=nproc)
    else:
        record = _through_executor(app, run, output)
    t = record["timing"]
    click.echo(f"{run.run_key}: {record['training']['status']}, {record['budget']['status']} "
               f"({record['budget']['actual_exposed']}/{record['budget']['target_exposed']} exposures), "
               f"{record['training']['counts']['steps']} steps, "
               f"loop {record['budget']['loop_seconds']:.1f} s (overshoot {record['budget']['overshoot_seconds']:.1f} s), "
               f"{t['allocated_gpu_hours_through_evaluation']:.4f} allocated GPU-h; wall {time.monotonic() - t0:.1f} s")


def _through_executor(app: App, run, output: Path) -> dict:  # type: ignore[no-untyped-def]
    from ..errors import ExecutorError
    from ..executor import make_executor

    # a run folder of its own (its checkpoint beside the attempt's folder), apart from the queue's runs
    folder = attempt_folder(app.settings.jobs_dir / "direct", f"{run.run_key}-{int(time.time())}", 1)
    ex = make_executor(run.executor, jobs_dir=app.settings.jobs_dir, profile=run.profile)
    job_id = ex.submit(run, 1, folder)
    click.echo(f"job {job_id}, logs in {folder}", err=True)
    info = ex.wait_final(job_id, max_delay=30.0)
    record = record_path(folder)
    if info.state != "COMPLETED" or not record.exists():
        raise ExecutorError(f"job {job_id} ended {info.state} without a record; see {folder}")
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(record, output)
    return json.loads(output.read_text())
