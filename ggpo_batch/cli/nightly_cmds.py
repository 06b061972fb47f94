"""`ggpo-batch nightly` and the `status --components` view: parse, call the components library, print."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..common.datafiles import search_path_text
from ..nightly.suite import DEFAULT_SUITE
from ..common.printable import printable_data
from .app import App, cli, echo_json, invoked_command, pass_app

if TYPE_CHECKING:
    from rich.console import Console


def _ints(value: str | None, param: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: comma-separated integers, e.g. 42,43,44", param_hint=param) from None


@cli.command()
@click.option("--seeds", help="Comma-separated seeds (default: the suite's, 42,43,44).")
@click.option("--methods", help="Comma-separated methods (default: the suite's, ggpo).")
@click.option("--corpus", type=click.Path(dir_okay=False, path_type=Path),
              help="Corpus file (default: the suite's, else the generated fallback).")
@click.option("--corpus-sha256", help="Refuse the corpus unless its sha256 is this.")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Record JSON (default: DATA_DIR/nightly/NIGHT/component-METHOD-cpu-seedsA-B.json).")
@click.option("--suite", "suite_path", metavar="NAME|FILE",
              help=f"Suite: a .toml file, or a name looked up in {search_path_text('suites')} "
                   f"(default: {DEFAULT_SUITE}).")
@click.option("--night", type=click.DateTime(formats=["%Y-%m-%d"]), help="Night to record (default: today, UTC).")
@click.option("--json", "as_json", is_flag=True, help="Print the record(s) as JSON.")
@pass_app
def nightly(app: App, seeds: str | None, methods: str | None, corpus: Path | None, corpus_sha256: str | None,
            output: Path | None, suite_path: str | None, night: datetime | None, as_json: bool) -> None:
    """Run the CPU component tier (l1_mechanism) once and record it: artifact + component-run row.

    At most once per method and night (the ledger refuses a second claim); no selection, no retries.
    """
    from ..nightly.night import artifact_path, run_method_night
    from ..nightly.suite import load_suite

    suite = load_suite(suite_path or DEFAULT_SUITE)
    seed_list = _ints(seeds, "--seeds") or suite.seeds
    method_list = tuple(m.strip() for m in methods.split(",") if m.strip()) if methods else suite.methods
    the_night = night.date() if night else datetime.now(UTC).date()
    ledger = app.ledger()
    command = invoked_command()
    results = []
    for method in method_list:
        out = output if output is not None and len(method_list) == 1 else None
        if out is None:
            base = artifact_path(app.settings.data_dir / "nightly", the_night, method, seed_list)
            out = base if output is None else output.with_name(f"{output.stem}-{method}{output.suffix}")
        results.append(run_method_night(ledger, suite=suite, method=method, night=the_night,
                                        actor=app.actor, command=command, output=out, seeds=seed_list,
                                        corpus=corpus, corpus_sha256=corpus_sha256))
    if as_json:
        echo_json("nightly", {"nights": [r.__dict__ for r in results]})
        return
    for r in results:
        if r.ran:
            click.echo(f"{r.method} {r.night}: {r.artifact} sha256 {r.artifact_sha256} ({r.seconds:.2f} s)")
        else:
            click.echo(f"{r.method} {r.night}: already claimed by {r.claimed_by}; nothing run")


def component_status_view(app: App, *, nights: int, threshold: float, as_json: bool) -> None:
    from ..nightly.history import component_status
    from ..nightly.suite import load_suite

    suite = load_suite()
    data = component_status(app.ledger(), cron=suite.schedule.cron, nights=nights, threshold=threshold,
                            methods=suite.methods)
    if as_json:
        echo_json("components", {"components": data})
    else:
        print_components(data)


def _f(v: Any) -> str:
    return "-" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))


def print_components(data: dict[str, Any], console: Console | None = None) -> None:
    from rich.table import Table

    from .tables import terminal_console as terminal

    console = console or terminal()
    data = printable_data(data)
    for m in data["methods"]:
        t = Table(title=f"nightly {m['method']} since {data['since']} (moved: > {data['threshold']:.0%} "
                        f"vs previous night)", title_justify="left")
        for col in ("night", "tier", "state", "seconds", "test NLL", "param delta", "commit", "moved / failed"):
            t.add_column(col)
        for row in m["nights"]:
            notes = [f"{x['metric']} {_f(x['previous'])}->{_f(x['current'])}" for x in row["moved"]]
            notes += [f"check failed: {c}" for c in row["failed_checks"]]
            if row["error"]:
                notes.append(row["error"][:80])
            commit = (row["commit"] or "-")[:10] + ("+dirty" if row["dirty"] else "")
            t.add_row(row["night"], row["tier"], row["state"], _f(row["seconds"]), _f(row["final_test_nll"]),
                      _f(row["parameter_delta_l2"]), commit, "; ".join(notes) or "-")
        console.print(t)
        if m["missed_nights"]:
            console.print(f"[bold red]missed nights ({len(m['missed_nights'])}):[/] " + ", ".join(m["missed_nights"]))
    if not data["methods"]:
        console.print("no component runs in the ledger (ggpo-batch nightly)")



