"""Commands over cost and results: report, decide, ledger export."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from ..common.printable import printable_data
from .app import (
    ARM_VALUE,
    FINITE_VALUE,
    NAME_VALUE,
    TEXT_VALUE,
    VERSION_VALUE,
    App,
    cli,
    echo_json,
    experiment_at,
    pass_app,
    pass_reader,
)
from .shell import COMPLETE_EXPERIMENT
from .ledger_cmds import ledger as ledger_group

if TYPE_CHECKING:
    from rich.console import Console


def _which(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[str, int | None]]:
    """EXPERIMENT arguments: NAME or NAME@VERSION, one or two, each checked like any name."""
    if not 1 <= len(values) <= 2:
        raise click.BadParameter(f"give one experiment, or two to compare (got {len(values)})", ctx=ctx, param=param)
    return [experiment_at(ctx, param, v) for v in values]


@cli.command()
@click.argument("experiments", nargs=-1, required=True, callback=_which, shell_complete=COMPLETE_EXPERIMENT,
                metavar="EXPERIMENT[@VERSION] [OTHER[@VERSION]]")
@click.option("--version", "version", type=int, callback=VERSION_VALUE,
              help="Experiment version (default: the latest); or write NAME@VERSION.")
@click.option("--baseline", default=None, callback=ARM_VALUE,
              help="Arm the others are compared with, by seed (default: the spec's `[experiment] baseline`: "
                   "`clean` if there is such an arm, else the first arm).")
@click.option("--outcomes", "outcome_set", callback=ARM_VALUE,
              help="The outcome set the outcome figures come from: an evaluation after training (`evaluate "
                   "--name`); default: the training allocation's own evaluation (`training`).")
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON (= --format json).")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "md", "html"]), default=None,
              help="text (terminal tables, the default), json, or one self-contained Markdown / HTML file with "
                   "the tables and the plots embedded.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file (default: stdout).")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write PNG plots into this folder: GPU-hours and steps per arm; outcome per arm and the "
                   "paired differences (forest plot) where runs have outcomes; learning curves (reward and KL "
                   "against loop seconds, per arm the mean over seeds with a band) where runs booked them.")
@pass_reader
def report(app: App, experiments: list[tuple[str, int | None]], version: int | None, baseline: str | None,
           outcome_set: str | None, as_json: bool, fmt: str | None, output: Path | None, plot_dir: Path | None) -> None:
    """What an experiment found and what it cost. Per arm: the evaluation outcome (reward on all,
    exposed and unexposed held-out items) with 95 % intervals, and per GPU-hour; arm - baseline
    paired by seed on the same items, with intervals; steps, loop time, GPU-hours, overshoot,
    tokens and exposure. Comparability warnings come first. Two experiments (or NAME@1 NAME@2):
    side by side. --outcomes NAME: the outcome figures of an evaluation after training (`evaluate`),
    with the same intervals and pairing; an item a run trained on counts as exposed in any set."""
    from ..reporting.compare import compare_reports
    from ..reporting.report import experiment_report

    if as_json and fmt not in (None, "json"):
        raise click.UsageError("--json and --format say the same thing: give one")
    fmt = "json" if as_json else (fmt or "text")
    if version is not None and len(experiments) == 2:
        raise click.UsageError("--version is for one experiment; compare versions as NAME@1 NAME@2")
    led = app.ledger()
    reps = [experiment_report(led, name, version=v if v is not None else version, baseline=baseline,
                              outcomes=outcome_set) for name, v in experiments]
    cmp = compare_reports(reps[0], reps[1]) if len(reps) == 2 else None
    from ..config.masking import scrub

    reps, cmp = scrub(reps), scrub(cmp)  # before any format lays them out (cut, escaped) in one place
    if fmt in ("md", "html"):
        _write(_document(led, fmt, reps, cmp, plot_dir), output)
        return
    plot_paths: list[str] = []
    if plot_dir is not None:
        for i, rep in enumerate(reps):
            plot_paths += [str(p) for p in _plots(led, rep, plot_dir / ("ab"[i] if cmp else ""))]
    data: Mapping[str, Any] = cmp if cmp is not None else reps[0]
    if fmt == "json":
        kind = "report_comparison" if cmp is not None else "report"
        if output is None:
            echo_json(kind, {**data, "plots": plot_paths})
        else:
            from ..common.schemas import dumps

            _write(dumps(kind, {**data, "plots": plot_paths}) + "\n", output)
        return
    if cmp is not None:
        print_comparison(cmp)
    else:
        print_report(data)
    for p in plot_paths:
        click.echo(f"plot: {p}")


def _plots(led: Any, rep: Mapping[str, Any], folder: Path) -> list[Path]:
    """The report's plots (plots.py) and its learning curves (curve_plots.py), written into `folder`."""
    from ..reporting.curve_plots import write_curve_plot
    from ..reporting.learning_curves import experiment_curves
    from ..reporting.plots import write_plots

    paths = write_plots(rep, folder)
    if rep.get("version") is not None and rep["arms"]:
        curve = write_curve_plot(experiment_curves(led, rep["experiment"], rep["version"]), folder, rep.get("baseline"))
        paths += [curve] if curve is not None else []
    return paths


def _document(led: Any, fmt: str, reps: list[dict[str, Any]], cmp: Mapping[str, Any] | None,
              plot_dir: Path | None) -> str:
    """The Markdown or HTML file: plots drawn into `plot_dir` (kept) or a temporary folder, embedded."""
    import tempfile

    from ..reporting.render import to_html, to_markdown
    from .app import invoked_command

    with tempfile.TemporaryDirectory(prefix="ggpo-report-") as tmp:
        plots: list[tuple[str, Path]] = []
        for i, rep in enumerate(reps):
            folder = Path(plot_dir or tmp) / ("ab"[i] if cmp else "")
            plots += [(cmp["compare"][i] if cmp else "", p) for p in _plots(led, rep, folder)]
        render = to_markdown if fmt == "md" else to_html
        return render(None if cmp else reps[0], plots, compare=cmp, command=invoked_command())


def _write(text: str, output: Path | None) -> None:
    """To stdout, or to `output` whole (a reader never sees half a file)."""
    if output is None:
        click.echo(text, nl=not text.endswith("\n"))
        return
    with _whole_file(output, "the report") as fh:
        fh.write(text)
    click.echo(f"wrote {output}", err=True)


@contextmanager
def _whole_file(output: Path, what: str) -> Iterator[TextIO]:
    """A file written beside `output` and renamed onto it when complete: a reader never sees half
    a file; a folder that cannot be written is one line (nothing written), not a traceback."""
    from ..errors import GgpoError

    if output.exists() and not output.is_file():  # a device or FIFO would be replaced by the rename
        raise GgpoError(f"{output}: not a regular file; write to stdout instead (leave out -o)")
    from ..config.masking import masked_file

    tmp = output.with_name(output.name + ".part")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            yield masked_file(fh)
        tmp.replace(output)
    except OSError as exc:
        raise GgpoError(f"{output}: cannot write {what} ({exc.strerror or exc}); nothing written") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def _print_warnings(console: Console, warnings: list[dict[str, Any]], notes: list[str]) -> None:
    power = [w for w in warnings if w["kind"] == "underpowered"]  # about the seeds, not about fairness
    warnings = [w for w in warnings if w["kind"] != "underpowered"]
    if warnings:
        console.print(f"[b red]comparability warnings ({len(warnings)})[/b red]: do not read the arms as equal-budget "
                      f"comparisons until these are understood")
        for w in warnings:
            console.print(f"  ! {w['message']}", markup=False, highlight=False)
    else:
        console.print("no comparability warnings: equal budgets, loop times and overshoot within the thresholds, "
                      "no retries, no failed audits, every seed paired, the same code, environment and hardware "
                      "(where runs recorded them)")
    for w in power:
        console.print(f"underpowered: {w['message']}", markup=False, highlight=False)
    for n in notes:
        console.print(f"note: {n}", markup=False, highlight=False)


def _print_tables(console: Console, tables: list[Any]) -> None:
    from rich.table import Table

    for tab in tables:
        t = Table(title=tab.title, title_justify="left")
        for i, col in enumerate(tab.columns):
            t.add_column(col, justify="left" if i == 0 or col in ("figure", "decoding") else "right")
        for row in tab.rows:
            t.add_row(*row)
        console.print(t)


def print_report(data: Mapping[str, Any], console: Console | None = None) -> None:
    """Lay out an experiment report as terminal tables, the comparability warnings first."""
    from ..reporting.render import footer_lines, report_tables
    from .tables import terminal_console as terminal

    console = console or terminal()
    data = printable_data(data)
    if data["arms"]:
        _print_warnings(console, data.get("warnings", []), data.get("notes", []))
    _print_tables(console, report_tables(data))
    for line in footer_lines(data):
        console.print(line, markup=False, highlight=False)


def print_comparison(data: Mapping[str, Any], console: Console | None = None) -> None:
    """Two reports side by side as terminal tables, the warnings first."""
    from ..reporting.render import compare_tables
    from .tables import terminal_console as terminal

    console = console or terminal()
    data = printable_data(data)
    _print_warnings(console, data["warnings"], data["a"].get("notes", []) + data["b"].get("notes", []))
    _print_tables(console, compare_tables(data))


@cli.command()
@click.argument("experiment", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT)
@click.option("--not-reproduced", "not_reproduced", is_flag=True,
              help="Decide not to reproduce EXPERIMENT because of its cost (the one decision made by hand).")
@click.option("--reason", required=True, callback=TEXT_VALUE, help="Why, in a sentence (kept in the ledger).")
@click.option("--cost-basis", required=True, callback=TEXT_VALUE,
              help="What the cost figure rests on (e.g. the paper's setup).")
@click.option("--cost-type", callback=TEXT_VALUE, help="Kind of figure (default: a reported configuration judged by review).")
@click.option("--available-budget", callback=TEXT_VALUE, help="What compute was available, in words.")
@click.option("--estimated-gpu-hours", type=click.FloatRange(min=0), callback=FINITE_VALUE,
              help="The cost judged, if known.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@pass_app
def decide(app: App, experiment: str, not_reproduced: bool, reason: str, cost_basis: str, cost_type: str | None,
           available_budget: str | None, estimated_gpu_hours: float | None, as_json: bool) -> None:
    """Record, after review, that EXPERIMENT is not reproduced because it costs too much.

    Queued runs of EXPERIMENT become not_reproduced; runs that already started keep their state.
    The experiment need not be in the ledger (e.g. a paper's full setup judged too expensive).
    """
    from ..control.costguard import decide_not_reproduced
    from ..reporting.status import decision_row

    if not not_reproduced:
        raise click.UsageError("say what is decided: --not-reproduced")
    out = decide_not_reproduced(app.ledger(), experiment, actor=app.actor, reason=reason,
                                cost_basis=cost_basis, cost_type=cost_type, available_budget=available_budget,
                                estimated_gpu_hours=estimated_gpu_hours)
    if as_json:
        echo_json("decide", {"decision": decision_row(out.decision), "runs_not_reproduced": list(out.runs_not_reproduced)})
        return
    click.echo(f"decided: {experiment} not reproduced (high cost), by {app.actor}; "
               f"{len(out.runs_not_reproduced)} queued runs marked not_reproduced")


@ledger_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), required=True, help="Output format.")
@click.option("--table", type=click.Choice(["runs", "attempts"]),
              help="Which table (CSV: default runs; JSON: default both).")
@click.option("--experiment", "-e", callback=NAME_VALUE, shell_complete=COMPLETE_EXPERIMENT,
              help="Only this experiment (all its versions).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="File (default: stdout).")
@pass_reader
def ledger_export(app: App, fmt: str, table: str | None, experiment: str | None, output: Path | None) -> None:
    """Runs and attempts as flat rows: CSV for a spreadsheet, JSON for a notebook."""
    from ..reporting.export import export_ledger

    if output is None:
        export_ledger(app.ledger(), sys.stdout, fmt=fmt, table=table, experiment=experiment)
        return
    led = app.ledger()
    with _whole_file(output, "the export") as fh:
        n = export_ledger(led, fh, fmt=fmt, table=table, experiment=experiment)
    click.echo(f"wrote {n} rows to {output}", err=True)
