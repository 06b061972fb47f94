"""Terminal tables (rich) for the CLI; nothing here computes, it only lays out. rich is imported
only to draw a table: `status` on an empty ledger prints one plain line without it."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from ..common.printable import printable_data

if TYPE_CHECKING:
    from rich.console import Console

NO_EXPERIMENTS = "no experiments in the ledger (ggpo-batch enqueue SPEC, or ggpo-batch ledger import FILE)"


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _shape(exp: dict[str, Any]) -> str:
    """`4 GPUs`, or `2 nodes x 4 GPUs` (status JSON: `nodes`, `gpus` per node)."""
    nodes = exp.get("nodes", 1)
    return f"{exp['gpus']} GPUs" if nodes == 1 else f"{nodes} nodes x {exp['gpus']} GPUs"


def terminal_console(width: int = 160) -> Console:
    """A rich console on stdout (its width the terminal's, else `width`), keeping rich's styles
    (`config.masking.layout_stream`): what it prints must be `printable_data` first."""
    from rich.console import Console

    from ..config.masking import layout_stream

    return Console(file=layout_stream(sys.stdout), width=None if sys.stdout.isatty() else width)


def print_status(experiments: Sequence[dict[str, Any]], console: Console | None = None) -> None:
    from ..config.masking import scrub

    # masked before a cell is cut short (a cut secret would not be masked whole), escaped (a ledger from
    # elsewhere may hold escape codes in any string)
    experiments = printable_data(scrub(experiments))
    if not experiments:
        if console is None:
            click.echo(NO_EXPERIMENTS)
        else:
            console.print(NO_EXPERIMENTS)
        return
    from rich.markup import escape
    from rich.table import Table

    from ..contracts.arm_train import changes_text
    from ..reporting.status import state_label

    console = console or terminal_console()
    for exp in experiments:
        t = Table(title=f"{exp['experiment']} v{exp['version']}  ({exp['method']}, {exp['source']}, "
                        f"{_shape(exp)}/run)", title_justify="left")
        for col, just in (("arm", "left"), ("seed", "right"), ("state", "left"), ("attempts", "right"),
                          ("steps", "right"), ("elapsed s", "right"), ("alloc GPU-h", "right"), ("est GPU-h", "right"),
                          ("note", "left")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        # Runs decided not to reproduce (no GPU spent) are listed apart from failed ones.
        ran = [r for r in exp["runs"] if r["state"] != "not_reproduced"]
        decided = [r for r in exp["runs"] if r["state"] == "not_reproduced"]
        for i, r in enumerate(ran + decided):
            if i == len(ran) and decided:
                t.add_section()
                t.add_row("[b]decided[/b]", "", "", "", "", "", "", "", "not reproduced: no GPU spent, not failed")
            note = []
            if r.get("queue_position") is not None:
                note.append(f"queue #{r['queue_position']}")
            if r.get("worker"):
                note.append(f"worker {r['worker']}")
            if r.get("job_id"):
                note.append(f"job {r['job_id']}")
            if r.get("accounting_disagreement"):
                note.append("GPU-h job/slurm disagree >1%")
            if r.get("audit_failed"):
                note.append("ROLLOUT AUDIT FAILED: not comparable")
            if r.get("budget_reconciled") is False:
                note.append("budget/exposure short: not matched")
            if r.get("cause"):
                note.append(escape(str(r["cause"])[:60]))
            state = state_label(r)  # a running run's progress, or its stopped heartbeat
            t.add_row(r["arm"], str(r["seed"]), state, str(r["attempts"]), _f(r["steps"]),
                      _f(r["elapsed_seconds"], 1), _f(r["allocated_gpu_hours"], 4), _f(r.get("estimated_gpu_hours"), 3),
                      "; ".join(note))
        t.add_section()
        changes = exp.get("changes") or {}
        for arm, tot in exp["arms"].items():
            changed = changes.get(arm)  # what the arm changes against the baseline
            t.add_row(f"[b]{arm}[/b] total", "", _states(tot["states"], tot), str(tot["attempts"]), _f(tot["steps"]), "",
                      _f(tot["allocated_gpu_hours"], 4), "", escape(changes_text(changed)) if changed else "")
        tot = exp["totals"]
        t.add_section()
        t.add_row("[b]experiment total[/b]", "", _states(tot["states"], tot), str(tot["attempts"]), _f(tot["steps"]), "",
                  f"[b]{_f(tot['allocated_gpu_hours'], 4)}[/b]", _f(exp.get("estimated_gpu_hours"), 3), "")
        console.print(t)
        if exp.get("runs_not_shown"):
            what = "runs needing a look" if exp.get("view") == "attention" else "runs"
            console.print(f"  {exp['runs_not_shown']:,} more {what} not listed "
                          f"(ggpo-batch status -e {exp['experiment']} --runs --limit 0 lists every run)", markup=False)
        elif exp.get("view") == "attention" and not exp["runs"]:
            console.print("  nothing needs a look: every run ended cleanly (--runs lists them)", markup=False)
        held = exp["totals"]["states"].get("held", 0)
        if held:
            console.print(f"  {held} run(s) held off the queue (a canary's or an earlier wave's): ggpo-batch release "
                          f"{exp['experiment']}@{exp['version']} queues them; ggpo-batch cancel --experiment "
                          f"{exp['experiment']} cancels them", markup=False)
        for c in exp.get("canaries", []):
            from ..reporting.canary_view import canary_line

            console.print(f"  {canary_line(c, exp['experiment'], exp['version'])}", markup=False)
        if exp.get("hung_runs"):
            console.print(f"  {exp['hung_runs']} running run(s) silent for over {exp['hung_after_seconds']:.0f} s: hung? "
                          f"(ggpo-batch logs RUN_KEY shows what they last wrote)", markup=False)
        for d in exp.get("decisions", []):
            console.print(f"  decision: {d['kind']} by {d['decided_by']}: {d.get('resolution') or d.get('reason')}",
                          markup=False)


def print_decided(decisions: Sequence[dict[str, Any]], console: Console | None = None) -> None:
    """Experiments decided before anything was queued: not failed, never run."""
    if not decisions:
        return
    from rich.markup import escape
    from rich.table import Table

    from ..config.masking import scrub

    decisions = printable_data(scrub(decisions))
    console = console or terminal_console()
    t = Table(title="decided, never queued (not failures: no GPU spent)", title_justify="left")
    for col in ("experiment", "decision", "est GPU-h", "cap GPU-h", "by", "review done", "resolution"):
        t.add_column(col, justify="right" if "GPU" in col else "left")
    for d in decisions:
        t.add_row(d["experiment"], d["kind"], _f(d["estimated_gpu_hours"], 2), _f(d["cap_gpu_hours"], 2),
                  escape(d["decided_by"]), "yes" if d["review_done"] else "no", escape(str(d["resolution"] or "")[:80]))
    console.print(t)


def _states(states: dict[str, int], totals: dict[str, Any] | None = None) -> str:
    text = ", ".join(f"{n} {s}" for s, n in states.items())
    if totals and totals.get("audit_failed"):
        text += f" ({totals['audit_failed']} audit failed)"
    return text


def print_costs(view: dict[str, Any]) -> None:
    """The cost view (reporting/spending.py): one row per group, then the totals."""
    from rich.markup import escape
    from rich.table import Table

    view = printable_data(view)
    since = f" since {view['since']}" if view["since"] else ""
    t = Table(title=f"costs by {view['by']}{since}", title_justify="left")
    for col, just in ((view["by"], "left"), ("booked GPU-h", "right"), ("attempts", "right"),
                      ("decided not spent GPU-h", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in view["rows"]:
        t.add_row(escape(_f(r["key"])), _f(r["gpu_hours"]), _f(r["attempts"]), _f(r["decided_not_spent_gpu_hours"]))
    tot = view["totals"]
    t.add_row("total", _f(tot["gpu_hours"]), _f(tot["attempts"]), _f(tot["decided_not_spent_gpu_hours"]),
              style="bold")
    terminal_console().print(t)
