"""An experiment report (or two side by side) laid out as plain tables, and as one self-contained
Markdown or HTML file with those tables and the plots embedded (PNG as data: URIs) -- for a paper's
appendix or a lab notebook. The terminal tables (`cli/report_cmds.py`) are built from the same
`Table`s, so every format shows the same figures. Nothing here computes a statistic.
"""

from __future__ import annotations

import base64
import html
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..common.printable import printable
from ..contracts.arm_train import changes_text
from ..contracts.outcome import OUTCOME_METRICS
from . import stats
from .compare import COMPARED_METRICS
from .fairness import LOOP_TIME_TOLERANCE, OVERSHOOT_TOLERANCE
from .plots import fmt

SHORT = {"eval_reward": "reward, all", "exposed_reward": "reward, exposed", "unexposed_reward": "reward, unexposed",
         "steps": "steps", "loop_seconds": "loop s", "allocated_gpu_hours": "GPU-h / run"}


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)


def _num(v: float | None, digits: int = 3, signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def _decimals(st: Mapping[str, Any]) -> int:
    """Decimals for 3 significant digits of the larger of |mean| and the interval's half-width."""
    scale = abs(st["mean"])
    if st.get("ci95"):
        scale = max(scale, (st["ci95"][1] - st["ci95"][0]) / 2)
    return 3 if scale == 0 else max(0, 2 - math.floor(math.log10(scale)))


def ci(st: Mapping[str, Any] | None, digits: int | None = 3, signed: bool = False) -> str:
    """"mean [low, high]" (the 95 % interval), "mean (n=1)" without one, "-" without values;
    `digits` None: as many decimals as 3 significant digits need (GPU-hours of a CPU run: 0.0189)."""
    if not st or st.get("mean") is None:
        return "-"
    digits = _decimals(st) if digits is None else digits
    text = _num(st["mean"], digits, signed)
    if st.get("ci95"):
        lo, hi = st["ci95"]
        return f"{text} [{_num(lo, digits, signed)}, {_num(hi, digits, signed)}]"
    n = st.get("n")
    return f"{text} (n={n})" if isinstance(n, int) else text


def ms(st: Mapping[str, Any] | None, digits: int = 2, pct: bool = False) -> str:
    """"mean ± std" (cost figures)."""
    if not st or st.get("mean") is None:
        return "-"
    scale, unit = (100.0, "%") if pct else (1.0, "")
    std = st.get("std")
    text = f"{st['mean'] * scale:,.{digits}f}{unit}"
    return text + (f" ± {std * scale:,.{digits}f}{unit}" if std is not None else "")


def heading(data: Mapping[str, Any]) -> str:
    head = f"{data['experiment']}"
    if data.get("version") is not None:
        head += f" v{data['version']}  ({data['method']}, {data['source']}, {data['gpus']} GPUs/run)"
    return head


def report_tables(data: Mapping[str, Any]) -> list[Table]:
    """The report's tables: outcome per arm, outcome differences vs the baseline, cost per arm, cost
    differences vs the baseline (those that have rows)."""
    out: list[Table] = []
    arms = data["arms"]
    if any(a.get("outcome_runs") for a in arms.values()):
        t = Table(f"{heading(data)}: evaluation outcome per arm{outcome_set_label(data)}, mean [95 % interval] over runs",
                  ["arm", "runs", *(SHORT[m] for m in OUTCOME_METRICS), "reward / GPU-h", "items", "decoding"])
        for arm, a in arms.items():
            t.rows.append([arm, str(a["outcome_runs"]), *(ci(a["outcome"][m]) for m in OUTCOME_METRICS),
                           ci(a["outcome_per_gpu_hour"]["eval_reward"], 1),
                           "-" if a["eval_items"]["mean"] is None else f"{a['eval_items']['mean']:g}",
                           ", ".join(a.get("decoding", [])) or "-"])
        out.append(t)
    changes = data.get("changes") or {}
    if any(changes.values()):
        t = Table(f"{heading(data)}: what each arm changes against the baseline {data.get('baseline')!r}",
                  ["arm", "changes"])
        t.rows += [[arm, changes_text(c) if arm != data.get("baseline") else "(baseline)"] for arm, c in changes.items()]
        out.append(t)
    paired = data.get("paired_vs_baseline") or {}
    from .powered import look_label

    looked = {arm: look_label(r.get("look")) for arm, r in ((data.get("power") or {}).get("arms") or {}).items()}
    if any(m in d for d in paired.values() for m in OUTCOME_METRICS):
        t = Table(f"arm - {data['baseline']}, paired by seed on the same items{outcome_set_label(data)}: Δ reward, "
                  f"mean [95 % interval]",
                  ["arm", "seeds", *(f"Δ {SHORT[m]}" for m in OUTCOME_METRICS)])
        for arm, d in paired.items():
            n = max((d[m]["n"] for m in OUTCOME_METRICS if m in d), default=0)
            t.rows.append([arm + looked.get(arm, ""), str(n), *(ci(d.get(m), signed=True) for m in OUTCOME_METRICS)])
        out.append(t)
    if arms:
        t = Table(f"{heading(data)}: cost per arm, mean ± sample std over n runs",
                  ["arm", "n", "steps", "loop s", "GPU-h/run", "GPU-h total", "overshoot", "generated tok",
                   "padded/tok", "exposed", "exposed, nonzero adv"])
        for arm, a in arms.items():
            t.rows.append([arm, str(a["steps"]["n"]), ms(a["steps"], 1), ms(a["loop_seconds"], 2),
                           ms(a["allocated_gpu_hours"], 3 if (a["allocated_gpu_hours"]["mean"] or 1) >= 0.01 else 5),
                           fmt(a["allocated_gpu_hours"]["total"], 4), ms(a["overshoot_fraction"], 2, pct=True),
                           ms(a["tokens"].get("backend_generated_tokens"), 0),
                           "-" if a.get("padding_ratio") is None else f"{a['padding_ratio']:.2f}",
                           ms(a["exposure"].get("actual_exposed"), 0),
                           ms(a["exposure"].get("exposed_with_nonzero_advantage"), 1)])
        out.append(t)
    if paired:
        t = Table(f"arm - {data['baseline']}, paired by seed (mean ± std over n seeds; 95 % interval of Δ steps)",
                  ["arm", "n", "Δ steps", "Δ steps 95 %", "Δ GPU-h", "Δ overshoot", "Δ generated tok"])
        for arm, d in paired.items():
            t.rows.append([arm + looked.get(arm, ""), str(len(d["seeds"])), ms(d["steps"], 1),
                           ci(d["steps"], 1, signed=True),
                           ms(d["allocated_gpu_hours"], 4), ms(d["overshoot_fraction"], 2, pct=True),
                           ms(d.get("backend_generated_tokens"), 0)])
        out.append(t)
    return out


def compare_tables(c: Mapping[str, Any]) -> list[Table]:
    la, lb = c["compare"]
    t = Table(f"{la} (A) vs {lb} (B), per arm: mean [95 % interval]; B - A with Welch's t interval (runs not paired)",
              ["arm", "figure", "A", "B", "B - A"])
    for arm, row in c["arms"].items():
        for m in COMPARED_METRICS:
            x = row[m]
            if x["a"]["n"] == 0 and x["b"]["n"] == 0:
                continue
            digits = 3 if m in OUTCOME_METRICS else None
            t.rows.append([arm, SHORT.get(m, m.replace("_", " ")), ci(x["a"], digits), ci(x["b"], digits),
                           ci(x["b_minus_a"], digits, signed=True)])
    out = [t]
    changes = c.get("changes") or {}
    if any(side for row in changes.values() for side in row.values()):
        t = Table(f"what each arm changes against the baseline {c['baseline']!r}, in A and in B", ["arm", "A", "B"])
        t.rows += [[arm, changes_text(row["a"]), changes_text(row["b"])] for arm, row in changes.items()]
        out.append(t)
    if c["paired_vs_baseline"]:
        t = Table(f"arm - {c['baseline']} paired by seed, in A and in B: Δ, mean [95 % interval]",
                  ["arm", "figure", "Δ in A", "Δ in B", "B - A"])
        for arm, row in c["paired_vs_baseline"].items():
            for m, x in row.items():
                digits = 3 if m in OUTCOME_METRICS else None
                t.rows.append([arm, SHORT.get(m, m.replace("_", " ")), ci(x["a"], digits, True),
                               ci(x["b"], digits, True), ci(x["b_minus_a"], digits, True)])
        out.append(t)
    return out


def outcome_set_label(data: Mapping[str, Any]) -> str:
    """` (outcome set 'NAME')` for figures from an evaluation after training; empty for the training's own."""
    name = data.get("outcome_set")
    return f" (outcome set {name!r})" if name and name != "training" else ""


def footer_lines(data: Mapping[str, Any]) -> list[str]:
    """Spend, audit failures, unreconciled budgets, what the seeds could detect and decisions, as sentences."""
    tot = data["totals"]
    decided = tot["decided_not_spent_gpu_hours"]
    evaluations = tot.get("evaluation_gpu_hours") or 0.0
    lines = [(f"spent: {tot['spent_gpu_hours']:.4f} GPU-h in {tot['attempts']} attempts of {tot['runs']} runs"
              + (f" (evaluations after training: {evaluations:.4f} of them)" if evaluations else "")
              + f"; decided not spent: {'unknown' if decided is None else f'{decided:.4f}'} GPU-h "
              f"({tot['decided_runs']} runs not reproduced)")]
    if tot.get("audit_failed_runs"):
        bad = {arm: a["audit_failed"] for arm, a in data["arms"].items() if a.get("audit_failed")}
        lines.append(f"rollout audit failed: {tot['audit_failed_runs']} succeeded runs ("
                     + ", ".join(f"{arm} {n}" for arm, n in bad.items())
                     + ") are left out of every statistic above; their GPU-h are in the spend")
    if tot.get("budget_not_reconciled_runs"):
        lines.append(f"budget or exposure target not reached: {tot['budget_not_reconciled_runs']} runs "
                     f"(their arms may not be compared as matched)")
    from .powered import summary_lines

    lines += summary_lines(data.get("power") or {})
    for d in data["decisions"]:
        lines.append(f"decision {d['kind']} by {d['decided_by']} (review done: {d['review_done']}, automatic "
                     f"retry: {d['automatic_retry']}): {d['resolution']}; cost basis: {d['cost_basis']}; "
                     f"cost type: {d['cost_type']}; available budget: {d['available_budget']}")
    return lines


def method_lines() -> list[str]:
    return [
        (f"Intervals: 95 % for the mean over runs (per arm) or over seeds (paired differences): Student's t with "
         f"n - 1 degrees of freedom below {stats.BOOTSTRAP_MIN_N} values, the BCa bootstrap "
         f"(scipy.stats.bootstrap, {stats.BOOTSTRAP_RESAMPLES:,} resamples, seeded) from {stats.BOOTSTRAP_MIN_N} on; "
         f"none for one value. Two experiments: Welch's t interval (independent runs)."),
        ("Paired differences: arm minus baseline for the same seed, each averaged over the same held-out items "
         "(for 'exposed', the items the arm's run actually trained on)."),
        (f"Comparability warnings: loop budgets not equal; mean loop time more than {LOOP_TIME_TOLERANCE:.0%} or "
         f"mean overshoot more than {OVERSHOOT_TOLERANCE * 100:g} points of the budget away from the baseline's; "
         f"any run short of its budget or exposure target, retried, or with a failed audit; executor, profile or GPU "
         f"count unlike the baseline's (the GPU model is not recorded); seeds without a pair; no baseline arm."),
    ]


# ---- files ------------------------------------------------------------------------------------

def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


# Characters that mean something to Markdown (CommonMark) wherever they stand in a line: emphasis,
# code, links and images, tables, HTML and entities, autolinks, strikethrough. Escaped with a
# backslash (any ASCII punctuation may be), '&' '<' '>' as entities (no raw HTML passes).
_MD_SPECIAL = frozenset("\\`*_[]|~!#")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def md_text(value: object) -> str:
    """`value` as Markdown text that renders as itself, on one line: user text (a decision's reason,
    a name, a path) can neither open a heading, list, table or code block (its line breaks become
    spaces) nor emphasise, link or embed HTML."""
    text = printable(" ".join(str(value).split()))  # and no terminal escape code for a reader who cats it
    return "".join(_MD_ENTITIES.get(c) or (f"\\{c}" if c in _MD_SPECIAL else c) for c in text)


def md_code(value: str) -> str:
    """`value` as a Markdown code span (shown verbatim, HTML included): fenced by one backtick more
    than its longest run of them; control characters (a line break in a quoted path) written as
    escapes, so the span stays on its line."""
    text = printable(value)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_table(t: Table) -> str:
    lines = [f"**{md_text(t.title)}**", "", "| " + " | ".join(md_text(c) for c in t.columns) + " |",
             "| " + " | ".join("---" if i == 0 or c in ("figure", "decoding") else "---:"
                               for i, c in enumerate(t.columns)) + " |"]
    lines += ["| " + " | ".join(md_text(c) for c in r) + " |" for r in t.rows]
    return "\n".join(lines)


def _sections(data: Mapping[str, Any] | None, c: Mapping[str, Any] | None) -> list[tuple[str, list[Any]]]:
    """(section title, [str | Table | ("plot", caption, path)]) of one report or a comparison."""
    parts: list[tuple[str, list[Any]]] = []
    warnings = (c or data or {}).get("warnings", [])
    parts.append(("Comparability warnings", [w["message"] for w in warnings]
                  or [("None: equal budgets, loop times and overshoot within the thresholds, no retries, no failed "
                       "audits, every seed paired, the same resources.")]))
    notes = (data or {}).get("notes", []) if c is None else c["a"].get("notes", []) + c["b"].get("notes", [])
    if notes:
        parts.append(("Notes", list(notes)))
    if c is not None:
        parts.append(("Results", compare_tables(c)))
        for side in ("a", "b"):
            parts.append((f"{c['compare'][0 if side == 'a' else 1]}", report_tables(c[side])
                          + footer_lines(c[side])))
    else:
        assert data is not None
        parts.append(("Results", report_tables(data) + footer_lines(data)))
    parts.append(("Method", method_lines()))
    return parts


def _captions() -> dict[str, str]:
    return {"outcome_per_arm": "Evaluation outcome per arm: one point per run (seed), the mean and its 95 % interval.",
            "paired_differences": "Arm minus baseline, paired by seed on the same items: mean and 95 % interval.",
            "gpu_hours_per_arm": "Allocated GPU-hours per run, through evaluation.",
            "steps_per_arm": "Optimizer steps reached under the equal loop-time budget."}


def to_markdown(data: Mapping[str, Any] | None, plots: Sequence[tuple[str, Path]], *,
                compare: Mapping[str, Any] | None = None, command: str = "") -> str:
    """One Markdown file: title, warnings, tables, plots (embedded), method."""
    title = " vs ".join(compare["compare"]) if compare else heading(data or {})
    out = [f"# Report: {md_text(title)}", "",
           f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}" + (f" by {md_code(command)}" if command else "")
           + " from the ggpo-batch ledger.", ""]
    for name, items in _sections(data, compare):
        out += [f"## {md_text(name)}", ""]
        for it in items:
            out += [_md_table(it) if isinstance(it, Table) else f"- {md_text(it)}" if name != "Results"
                    else md_text(it), ""]
    if plots:
        out += ["## Plots", ""]
        for label, p in plots:
            cap = _captions().get(Path(p).stem, Path(p).stem)
            image = f"![{md_text(label)} {md_text(Path(p).stem)}]({_png_uri(p)})"
            out += [(f"**{md_text(label)}** " if label else "") + md_text(cap), "", image, ""]
    return "\n".join(out)


_CSS = ("body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
        "th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}"
        "th{background:#f3f3f3}caption{text-align:left;font-weight:600;padding:4px 0}"
        ".warn{color:#a50f15}img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#555}")


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in t.rows)
    return f"<table><caption>{html.escape(t.title)}</caption><tr>{head}</tr>{body}</table>"


def to_html(data: Mapping[str, Any] | None, plots: Sequence[tuple[str, Path]], *,
            compare: Mapping[str, Any] | None = None, command: str = "") -> str:
    """One self-contained HTML page: the same content as `to_markdown`."""
    title = " vs ".join(compare["compare"]) if compare else heading(data or {})
    gen = (f"Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
           + (f" by <code>{html.escape(command)}</code>" if command else "") + " from the ggpo-batch ledger.")
    out = [(f"<!doctype html><html><head><meta charset='utf-8'><title>Report: {html.escape(title)}</title>"
            f"<style>{_CSS}</style></head><body>"), f"<h1>Report: {html.escape(title)}</h1><p>{gen}</p>"]
    for name, items in _sections(data, compare):
        out.append(f"<h2>{html.escape(name)}</h2>")
        texts = [it for it in items if isinstance(it, str)]
        cls = " class='warn'" if name == "Comparability warnings" and (compare or data or {}).get("warnings") else ""
        for it in items:
            if isinstance(it, Table):
                out.append(_html_table(it))
        if texts:
            out.append(f"<ul{cls}>" + "".join(f"<li>{html.escape(x)}</li>" for x in texts) + "</ul>")
    if plots:
        out.append("<h2>Plots</h2>")
        for label, p in plots:
            cap = _captions().get(Path(p).stem, Path(p).stem)
            out.append(f"<figure><img src=\"{_png_uri(p)}\" alt=\"{html.escape(label + ' ' + Path(p).stem)}\">"
                       f"<figcaption>{html.escape(label)}: {html.escape(cap)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)
