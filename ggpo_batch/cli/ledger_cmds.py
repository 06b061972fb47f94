"""Commands over the ledger: db, ledger import, status."""

from __future__ import annotations

import json

import click

from ..config.secrets import redact
from .app import COUNT_VALUE, NAME_VALUE, App, cli, echo_json, pass_app, pass_reader
from .shell import COMPLETE_EXPERIMENT


@cli.group()
def db() -> None:
    """Create, migrate and inspect the ledger database (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@pass_app
def db_upgrade(app: App, revision: str) -> None:
    """Apply migrations up to REVISION (creates the SQLite file if needed)."""
    from ..ledger.db import current_revision, upgrade

    engine = app.engine(check=False)
    before = current_revision(engine)
    upgrade(engine, revision)
    after = current_revision(engine)
    where = redact(engine.url.render_as_string(hide_password=True))
    click.echo(f"ledger {where}: {before or 'empty'} -> {after}")


@db.command("downgrade")
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Do not ask; downgrading to 'base' drops every table.")
@pass_app
def db_downgrade(app: App, revision: str, yes: bool) -> None:
    """Revert migrations down to REVISION ('base' = empty database)."""
    from ..ledger.db import current_revision, downgrade

    engine = app.engine(check=False)  # a ledger this user may not write is refused before asking
    if not yes:
        click.confirm(f"Downgrade the ledger to {revision}? Data in dropped tables is lost", abort=True)
    before = current_revision(engine)
    downgrade(engine, revision)
    click.echo(f"ledger: {before} -> {current_revision(engine) or 'base'}")


@db.command("current")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_reader
def db_current(app: App, as_json: bool) -> None:
    """Show the schema revision of the ledger and the one this code needs."""
    from ..ledger.db import current_revision, head_revision

    engine = app.engine(check=False)
    info = {"url": redact(engine.url.render_as_string(hide_password=True)), "current": current_revision(engine),
            "head": head_revision()}
    if as_json:
        echo_json("db_current", info)
    else:
        click.echo(f"{info['url']}: at {info['current'] or 'empty'}, code needs {info['head']}")


@cli.group()
def ledger() -> None:
    """Import results into, and export from, the ledger."""


@ledger.command("import")
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@click.option("--name", callback=NAME_VALUE, help="Experiment name (default: the file name without extension).")
@click.option("--method", default="ggpo", show_default=True, callback=NAME_VALUE, help="Method that produced the file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def ledger_import(app: App, file: str, name: str | None, method: str, as_json: bool) -> None:
    """Load a results FILE (seed-000 schema, keyed "<seed>/<arm>") as a finished experiment.

    Every record is checked first (schema; GPU-hours = gpus x elapsed / 3600; overshoot = loop -
    budget); any broken record refuses the whole file. Importing the same file again changes nothing.
    """
    from ..control import progress
    from ..control.importer import import_results

    with progress.shown():
        rep = import_results(app.ledger(), file, actor=app.actor, name=name, method=method)
    if as_json:
        echo_json("ledger_import", rep.__dict__)
        return
    verb = "imported" if rep.created else "already in the ledger, nothing changed:"
    click.echo(f"{verb} {rep.experiment} v{rep.version}: {rep.runs} runs, "
               f"{rep.total_gpu_hours:.4f} allocated GPU-hours through evaluation")


@cli.command()
@click.option("--experiment", "-e", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT,
              help="Only this experiment (all its versions).")
@click.option("--state", "-s", "states", multiple=True, help="Only runs in this state (repeatable).")
@click.option("--runs", "all_runs", is_flag=True,
              help="List every run (in --state), not only those that need a look.")
@click.option("--limit", type=click.IntRange(0, None), default=None, callback=COUNT_VALUE,
              help="Most runs listed per experiment; 0 = no limit. [default: 20, or none with --runs or --state]")
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON, streamed.")
@click.option("--components", is_flag=True, help="Nightly CPU component runs instead: last nights, moved metrics, "
              "missed nights.")
@click.option("--nights", default=14, show_default=True, type=click.IntRange(1, 365), help="With --components.")
@click.option("--threshold", default=0.1, show_default=True, type=click.FloatRange(0, None),
              help="With --components: relative change of a metric's mean that counts as moved.")
@pass_reader
def status(app: App, experiment: str | None, states: tuple[str, ...], all_runs: bool, limit: int | None,
           as_json: bool, components: bool, nights: int, threshold: float) -> None:
    """Per experiment and arm: runs by state, attempts, steps, allocated GPU-hours (totals from the
    ledger in SQL); then the runs that need a look (unfinished, failed, lost, flagged), 20 at
    most. --runs lists every run, --state only those states, --limit sets the page."""
    if components:
        from .nightly_cmds import component_status_view

        component_status_view(app, nights=nights, threshold=threshold, as_json=as_json)
        return
    from ..contracts.states import RUN_STATES

    bad = [s for s in states if s not in RUN_STATES]
    if bad:
        raise click.BadParameter(f"{bad[0]!r}; states are {', '.join(RUN_STATES)}", param_hint="--state")
    from ..ledger.db import is_empty

    if is_empty(app.engine()):  # nothing to show, whatever was asked: said without the ORM or rich
        if as_json:
            _stream_json(iter(()), list)
        else:
            from .tables import print_decided, print_status

            print_status([])
            print_decided([])
        return
    from ..reporting.status import StatusQuery, decided_experiments, iter_experiment_status

    led = app.ledger()
    query = StatusQuery.of(states, all_runs=all_runs, limit=limit)
    it = iter_experiment_status(led, experiment=experiment, states=query.states, attention=query.attention,
                                limit=query.limit, positions=None if app.settings.inline_queue else _positions(app),
                                hung_after=app.settings.hung_after_seconds)
    wants_decided = query.with_decided
    if as_json:
        _stream_json(it, lambda: decided_experiments(led, experiment=experiment) if wants_decided else [])
        return
    from .tables import print_decided, print_status

    data = [{**summary, "runs": list(rows)} for summary, rows in it]
    decided = decided_experiments(led, experiment=experiment) if wants_decided else []
    if data or not decided:
        print_status(data)
    print_decided(decided)


def _positions(app: App):  # type: ignore[no-untyped-def]
    """Where Redis has queued runs, asked only for runs shown; with a warning (once) and nothing if
    Redis is down: status still shows the ledger."""
    warned = []

    def lookup(queue: str, run_keys: list[str] | None) -> dict[str, dict]:
        from ..control.queue import RunQueue

        try:
            return RunQueue.from_url(app.settings.redis_url, app.settings.queue_for(queue or None)).positions(run_keys)
        except Exception as exc:  # status must still show the ledger when Redis is down
            if not warned:
                warned.append(exc)
                click.echo(f"warning: queue positions unavailable ({type(exc).__name__}); showing the ledger only",
                           err=True)
            return {}

    return lookup


def _stream_json(experiments, decided) -> None:  # type: ignore[no-untyped-def]
    """`{"schema": N, "experiments": [...], "decided": [...]}` written as it is read: one run row at a
    time, the schema number on the first line."""
    from ..common.schemas import stream_head

    def write(text: str) -> None:
        click.echo(text, nl=False)

    write(stream_head("status") + ', "experiments": [')
    for i, (summary, rows) in enumerate(experiments):
        head = json.dumps(summary, sort_keys=True, default=str)
        write(("," if i else "") + "\n" + head[:-1] + ', "runs": [')
        for j, row in enumerate(rows):
            write(("," if j else "") + "\n  " + json.dumps(row, sort_keys=True, default=str))
        write("]}")
    write('\n], "decided": ' + json.dumps(decided(), sort_keys=True, default=str) + "}\n")

