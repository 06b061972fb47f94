"""`ggpo-batch gc`: remove the checkpoints and attempt folders of finished runs (ggpo_batch/control/cleanup.py)."""

from __future__ import annotations

import re
from datetime import timedelta

import click

from .app import NAME_VALUE, App, cli, echo_json, pass_app
from .shell import COMPLETE_EXPERIMENT

_DURATION = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(value: str) -> timedelta:
    """`30d`, `12h`, `0d` (s, m, h, d, w) as a timedelta; click.BadParameter otherwise."""
    m = _DURATION.match(value.strip())
    if not m:
        raise click.BadParameter(f"{value!r} is not a duration like 30d, 12h or 0d (units s, m, h, d, w)")
    return timedelta(seconds=int(m.group(1)) * _UNIT_SECONDS[m.group(2)])


@cli.command()
@click.option("--older-than", "older_than", default="30d", show_default=True, metavar="AGE",
              callback=lambda ctx, param, value: parse_age(value),
              help="Only runs whose last state change is at least this old (30d, 12h, 0d for every finished run).")
@click.option("--experiment", "-e", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT,
              help="Only this experiment's runs (every version).")
@click.option("--dry-run", is_flag=True, help="Say what would be removed and how much it would free; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="What was (or would be) removed, per run, as JSON.")
@pass_app
def gc(app: App, older_than: timedelta, experiment: str | None, dry_run: bool, as_json: bool) -> None:
    """Remove the checkpoints and attempt folders of finished runs, and say how much that freed.

    \b
    Removed: a run's checkpoint folder, and its attempt folders except the one holding its last
    attempt's logs (for a job Slurm requeued, the folder of the attempt that submitted it).
    Never removed: result records, their details, exported policies, anything of a run that is
    queued, submitted or running, or of a cancelled run whose job has not ended yet. Each run's
    removal is booked in the ledger's events (`status` and the dashboard show them).
    (A run's checkpoint is already removed once its record is booked, unless its spec sets
    `keep_checkpoints = true`.)
    \b
    An age reaching before the calendar's start (999999w) is nothing that old: nothing removed, exit 0.
    \b
    Exit codes: 0 done (also when nothing was left to remove); 2 bad option or unknown experiment.
    \b
      ggpo-batch gc --dry-run
      ggpo-batch gc --older-than 0d --experiment exposure-5arm --json
    """
    from ..control.cleanup import collect
    from ..errors import LedgerError

    led = app.ledger()
    if experiment is not None and not led.experiments(experiment):
        raise LedgerError(f"no experiment {experiment!r} in the ledger")
    rep = collect(led, app.settings.jobs_dir, actor=app.settings.user, older_than=older_than, experiment=experiment,
                  dry_run=dry_run)
    if as_json:
        echo_json("gc", rep.to_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for run in rep.runs:
        click.echo(f"{run['run_key']} ({run['state']}): {verb} {len(run['removed'])} path(s), "
                   f"{run['bytes'] / 1e6:.1f} MB")
        for r in run["removed"]:
            click.echo(f"  {r['what']}: {r['path']} ({r['bytes'] / 1e6:.1f} MB)")
    freed = "would free" if dry_run else "freed"
    click.echo(f"{len(rep.runs)} run(s), {rep.freed_bytes / 1e6:.1f} MB {freed}; "
               f"{rep.skipped_live} unfinished run(s) left alone")
