"""Commands over cost and results: report, decide, ledger export."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .app import ARM_VALUE, FINITE_VALUE, NAME_VALUE, TEXT_VALUE, VERSION_VALUE, App, cli, echo_json, pass_app
from .ledger_cmds import ledger as ledger_group

if TYPE_CHECKING:
    from rich.console import Console


@cli.command()
@click.argument("experiment", callback=NAME_VALUE)
@click.option("--version", "version", type=int, callback=VERSION_VALUE, help="Experiment version (default: the latest).")
@click.option("--baseline", default="clean", show_default=True, callback=ARM_VALUE,
              help="Arm the others are compared with, by seed.")
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write PNG plots (GPU-hours per arm, steps per arm) into this folder.")
@pass_app
def report(app: App, experiment: str, version: int | None, baseline: str, as_json: bool,
           plot_dir: Path | None) -> None:
    """Per arm: mean, std and n of steps, GPU-hours, overshoot, tokens and exposure; arm - baseline
    differences paired by seed; GPU-hours spent and decided not spent."""
    from ..reporting.report import experiment_report

    data = experiment_report(app.ledger(), experiment, version=version, baseline=baseline)
    plots: list[str] = []
    if plot_dir is not None:
        from ..reporting.plots import write_plots

        plots = [str(p) for p in write_plots(data, plot_dir)]
    if as_json:
        echo_json({**data, "plots": plots})
        return
    print_report(data)
    for p in plots:
        click.echo(f"plot: {p}")


def _ms(st: Mapping[str, Any] | None, digits: int = 2, pct: bool = False) -> str:
    if not st or st.get("mean") is None:
        return "-"
    scale = 100.0 if pct else 1.0
    std = st.get("std")
    unit = "%" if pct else ""
    text = f"{st['mean'] * scale:,.{digits}f}{unit}"
    return text + (f" ± {std * scale:,.{digits}f}{unit}" if std is not None else "")


def print_report(data: Mapping[str, Any], console: Console | None = None) -> None:
    """Lay out an experiment report as terminal tables."""
    from rich.console import Console
    from rich.table import Table

    from .tables import _f

    console = console or Console(width=None if sys.stdout.isatty() else 160)
    head = f"{data['experiment']}" + (f" v{data['version']}  ({data['method']}, {data['source']}, "
                                      f"{data['gpus']} GPUs/run)" if data["version"] is not None else "")
    if data["arms"]:
        t = Table(title=f"{head}: per arm, mean ± sample std over n runs", title_justify="left")
        for col in ("arm", "n", "steps", "GPU-h/run", "GPU-h total", "overshoot", "generated tok", "exposed",
                    "exposed, nonzero adv"):
            t.add_column(col, justify="left" if col == "arm" else "right")
        for arm, a in data["arms"].items():
            t.add_row(arm, str(a["steps"]["n"]), _ms(a["steps"], 1), _ms(a["allocated_gpu_hours"], 3),
                      _f(a["allocated_gpu_hours"]["total"], 3), _ms(a["overshoot_fraction"], 2, pct=True),
                      _ms(a["tokens"].get("backend_generated_tokens"), 0), _ms(a["exposure"].get("actual_exposed"), 0),
                      _ms(a["exposure"].get("exposed_with_nonzero_advantage"), 1))
        console.print(t)
    if data["paired_vs_baseline"]:
        t = Table(title=f"arm - {data['baseline']}, paired by seed (mean ± std over n seeds)", title_justify="left")
        for col in ("arm", "n", "Δ steps", "Δ GPU-h", "Δ overshoot", "Δ generated tok"):
            t.add_column(col, justify="left" if col == "arm" else "right")
        for arm, d in data["paired_vs_baseline"].items():
            t.add_row(arm, str(len(d["seeds"])), _ms(d["steps"], 1), _ms(d["allocated_gpu_hours"], 3),
                      _ms(d["overshoot_fraction"], 2, pct=True), _ms(d.get("backend_generated_tokens"), 0))
        console.print(t)
    tot = data["totals"]
    decided = tot["decided_not_spent_gpu_hours"]
    console.print(f"spent: [b]{tot['spent_gpu_hours']:.4f}[/b] GPU-h in {tot['attempts']} attempts of {tot['runs']} "
                  f"runs; decided not spent: {'unknown' if decided is None else f'{decided:.4f}'} GPU-h "
                  f"({tot['decided_runs']} runs not reproduced)")
    if tot.get("audit_failed_runs"):
        bad = {arm: a["audit_failed"] for arm, a in data["arms"].items() if a.get("audit_failed")}
        console.print(f"[b]rollout audit failed[/b]: {tot['audit_failed_runs']} succeeded runs ("
                      + ", ".join(f"{arm} {n}" for arm, n in bad.items())
                      + ") are left out of every statistic above; their GPU-h are in the spend")
    if tot.get("budget_not_reconciled_runs"):
        console.print(f"budget or exposure target not reached: {tot['budget_not_reconciled_runs']} runs "
                      f"(their arms may not be compared as matched)")
    for d in data["decisions"]:
        console.print(f"decision {d['kind']} by {d['decided_by']} (review done: {d['review_done']}, automatic "
                      f"retry: {d['automatic_retry']}): {d['resolution']}\n  cost basis: {d['cost_basis']}\n"
                      f"  cost type: {d['cost_type']}\n  available budget: {d['available_budget']}", markup=False)


@cli.command()
@click.argument("experiment", callback=NAME_VALUE)
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
    from ..costguard import decide_not_reproduced
    from ..reporting.status import decision_row

    if not not_reproduced:
        raise click.UsageError("say what is decided: --not-reproduced")
    out = decide_not_reproduced(app.ledger(), experiment, actor=app.settings.user, reason=reason,
                                cost_basis=cost_basis, cost_type=cost_type, available_budget=available_budget,
                                estimated_gpu_hours=estimated_gpu_hours)
    if as_json:
        echo_json({"decision": decision_row(out.decision), "runs_not_reproduced": list(out.runs_not_reproduced)})
        return
    click.echo(f"decided: {experiment} not reproduced (high cost), by {app.settings.user}; "
               f"{len(out.runs_not_reproduced)} queued runs marked not_reproduced")


@ledger_group.command("export")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), required=True, help="Output format.")
@click.option("--table", type=click.Choice(["runs", "attempts"]),
              help="Which table (CSV: default runs; JSON: default both).")
@click.option("--experiment", "-e", callback=NAME_VALUE, help="Only this experiment (all its versions).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="File (default: stdout).")
@pass_app
def ledger_export(app: App, fmt: str, table: str | None, experiment: str | None, output: Path | None) -> None:
    """Runs and attempts as flat rows: CSV for a spreadsheet, JSON for a notebook."""
    from ..reporting.export import export_ledger

    if output is None:
        export_ledger(app.ledger(), sys.stdout, fmt=fmt, table=table, experiment=experiment)
        return
    from ..errors import GgpoError

    led = app.ledger()
    tmp = output.with_name(output.name + ".part")
    try:
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            n = export_ledger(led, fh, fmt=fmt, table=table, experiment=experiment)
        tmp.replace(output)  # a reader never sees half a file
    except OSError as exc:
        raise GgpoError(f"{output}: cannot write the export ({exc.strerror or exc}); nothing written") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    click.echo(f"wrote {n} rows to {output}", err=True)
