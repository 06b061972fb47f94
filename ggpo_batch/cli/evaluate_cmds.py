"""`evaluate`: score every succeeded run's exported policy again, on a new data file (ggpo_batch/control/evaluations.py)."""

from __future__ import annotations

from typing import Any

import click

from ..control import progress
from .app import NAME_VALUE, VERSION_VALUE, App, cli, echo_json, pass_app
from .shell import COMPLETE_EXPERIMENT


def _outcome_set(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from ..contracts.evaluation_spec import name_problem

    problem = name_problem(value)
    if problem:
        raise click.BadParameter(problem, ctx=ctx, param=param)
    return value


@cli.command()
@click.argument("experiment", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT)
@click.option("--data", required=True, type=click.Path(path_type=str),
              help="A JSONL file of items, the format of [train.data]'s eval file: {\"id\", \"question\", "
                   "\"answers\", \"support_titles\"} per line.")
@click.option("--name", required=True, callback=_outcome_set,
              help="The outcome set's name (letters, digits, '_'): `report --outcomes NAME` reads it.")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1, 64),
              help="GPUs of each evaluation's allocation (one node; on the local executor, CPU ranks).")
@click.option("--version", "version", type=int, callback=VERSION_VALUE,
              help="Experiment version (default: the latest).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def evaluate(app: App, experiment: str, data: str, name: str, gpus: int, version: int | None, as_json: bool) -> None:
    """Queue one evaluation per succeeded run of EXPERIMENT: its exported policy scores the items of
    --data, with the run's own codec, retrieval, rollout backend and decoding, as the outcome set
    NAME. Each is an attempt of kind `evaluation` beside its run (which stays succeeded), through
    the same queue, executors and GPU-hour accounting as training; `cancel RUN_KEY --evaluation NAME`
    stops one, `retry RUN_KEY --evaluation NAME --reason TEXT` runs a failed one again (never
    automatically). An item the run trained on counts as exposed in this set too.

    A bad data file is refused here, one line naming the file, line and field, exit 2, nothing
    queued. Run again, it adds only the runs not evaluated yet; the same NAME with other data is
    refused. Runs without an exported policy or trained item ids (imported ones) are listed, left out.

    \b
    --json: {"experiment", "version", "name", "data": {"path", "sha256", "items"}, "gpus", "queue",
    "evaluations": [{"key", "run_key", "state", "new"}], "skipped": [{"run_key", "reason"}], "enqueued"}
    """
    from ..control.evaluations import evaluate_experiment

    with progress.shown():  # the embedded queue (memory://) runs every job here: show them
        res = evaluate_experiment(app.ledger(), app.settings, experiment, data=data, name=name, gpus=gpus,
                                  version=version, actor=app.settings.user)
    rows: list[dict[str, Any]] = [{"key": e.key, "run_key": e.run.run_key, "state": e.state, "new": e in res.added}
                                  for e in [*res.added, *res.existing]]
    if as_json:
        echo_json("evaluate", {"experiment": res.experiment, "version": res.version, "name": res.name,
                               "data": {"path": res.data, "sha256": res.data_sha256, "items": res.items},
                               "gpus": res.gpus, "queue": res.queue, "evaluations": rows,
                               "skipped": [{"run_key": k, "reason": why} for k, why in res.skipped],
                               "enqueued": res.enqueued})
        return
    click.echo(f"{res.experiment} v{res.version}: outcome set {res.name!r} of {res.items} items "
               f"({res.data}): {len(res.added)} evaluation(s) queued on {res.queue!r} on {res.gpus} GPU(s) each"
               + (f", {len(res.existing)} already in the ledger" if res.existing else ""))
    for key, why in res.skipped:
        click.echo(f"left out {key}: {why}")
