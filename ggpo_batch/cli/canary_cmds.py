"""`ggpo-batch canary`: the canary(ies) before a sweep of an experiment version, and their re-run
after a fix (control/canary.py)."""

from __future__ import annotations

import click

from ..control import progress
from ..errors import EXIT_FAILED
from .app import App, cli, echo_json, experiment_at, pass_reader


@cli.command()
@click.argument("experiment", metavar="NAME[@VERSION]", callback=experiment_at)
@click.option("--rerun", is_flag=True, help="Re-run the version's failed canaries (after a fix): the runs they "
              "cancelled go back to held, and are released when the canary passes.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_reader  # showing only reads (works on a ledger you may not write); --rerun writes
def canary(app: App, experiment: tuple[str, int | None], rerun: bool, as_json: bool) -> None:
    """Show the canaries of NAME (the latest version, or @VERSION): one per distinct model, rollout,
    ZeRO stage and tensor parallel size of its runs, run before the sweep; each check's result and why
    one failed. Exit 0: shown (none failed); 1: a canary failed; 2: bad input."""
    from ..control.canary import rerun as rerun_canaries
    from ..control.canary import view

    name, version = experiment
    app.reads_only = not rerun  # --rerun writes: refused on a ledger read-only to you (exit 6)
    ledger = app.ledger()
    queued: list[str] = []
    if rerun:
        with progress.shown():
            queued = rerun_canaries(ledger, app.settings, name, version, actor=app.actor)
    doc = view(ledger, name, version)
    doc["rerun"] = queued
    failed = [c for c in doc["canaries"] if c["state"] in ("failed", "lost")]
    if as_json:
        echo_json("canary", doc)
    else:
        if queued:
            click.echo(f"re-run: {', '.join(queued)} queued; their runs are held until it passes")
        if not doc["canaries"]:
            click.echo(f"{doc['experiment']} v{doc['version']}: no canary")
        for c in doc["canaries"]:
            s = c["shape"]
            click.echo(f"{c['key']}: {c['state']} ({s['model']}, rollout {s['rollout']}, ZeRO-{s['zero_stage']}, "
                       f"TP {s['tensor_parallel_size']}; {c['attempts']} attempt(s), {c['gpu_hours']:.3f} GPU-h)"
                       + (f": {c['reason']}" if c["reason"] else ""))
            for k in c["checks"]:
                mark = "passed" if k["passed"] else "FAILED" if k["passed"] is False else "-"
                click.echo(f"  {k['name']}: {mark}" + (" (sleep/wake skipped: CPU)" if k["skipped"] else "")
                           + (f": {k['reason']}" if k["reason"] and k["passed"] is False else ""))
    if failed:
        raise SystemExit(EXIT_FAILED)
