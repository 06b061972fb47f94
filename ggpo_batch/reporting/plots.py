"""PNG plots of an experiment report: GPU-hours per arm with per-seed points, steps per arm; and,
where runs have evaluation outcomes, the outcome per arm (per-seed points, mean, 95 % interval) and
a forest plot of the arm - baseline differences paired by seed.

Drawn from the report dict only (nothing recomputed), with matplotlib's object API and the Agg
canvas, so no global pyplot state and no display is needed.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..contracts.outcome import METRIC_LABELS, OUTCOME_METRICS

log = logging.getLogger(__name__)

_SEED_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def fmt(v: float | None, digits: int = 3) -> str:
    """A figure with `digits` significant digits and no exponent for everyday magnitudes:
    0.001712 -> "0.00171", 3.81 -> "3.81", 75.3 -> "75.3", 12345.6 -> "12,346"."""
    if v is None:
        return "-"
    if v == 0:
        return "0"
    mag = math.floor(math.log10(abs(v)))
    if mag >= digits - 1:
        return f"{v:,.0f}"
    if mag < -5:
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits - 1 - mag}f}"


def shared_legend(axes: Any) -> None:
    """One legend beside the last panel for the labels of every panel (each label once)."""
    handles, names = [], []
    for ax in axes:
        h, n = ax.get_legend_handles_labels()
        handles, names = handles + h, names + n
    if handles:
        uniq = dict(zip(names, handles))
        axes[-1].legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def _tidy_axis(axis: Any, lo: float, hi: float, *, signed: bool = False, nbins: int = 6) -> None:
    """Ticks at 1-2-5 multiples, each label with exactly the decimals the tick spacing needs (0.005 ->
    "0.005", 2 -> "2"), so small values read as numbers, not as 0.00 or 5.00e-03."""
    from matplotlib.ticker import MaxNLocator

    locator = MaxNLocator(nbins=nbins, steps=[1, 2, 5, 10])
    ticks = [t for t in locator.tick_values(lo, hi) if lo <= t <= hi] or [lo, hi]
    step = min((b - a for a, b in itertools.pairwise(ticks)), default=abs(hi - lo) or 1.0)
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 0
    axis.set_major_locator(locator)

    def label(v: float, _pos: Any = None) -> str:
        if abs(v) < 0.5 * 10**-decimals:
            return "0"
        return f"{v:+,.{decimals}f}" if signed else f"{v:,.{decimals}f}"

    axis.set_major_formatter(label)


def _arm_order(report: Mapping[str, Any]) -> list[str]:
    arms = sorted(report["arms"])
    base = report.get("baseline")
    return ([base] if base in arms else []) + [a for a in arms if a != base]


def _bar_plot(report: Mapping[str, Any], key: str, *, ylabel: str, title: str,
              footer: str, path: Path, show_total: bool) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    arms = _arm_order(report)
    seeds = sorted({s for a in arms for s in report["arms"][a]["per_seed"]})
    colour = {s: _SEED_COLOURS[i % len(_SEED_COLOURS)] for i, s in enumerate(seeds)}
    fig = Figure(figsize=(max(6.5, 1.6 * len(arms) + 2.5), 5.0), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    means = [report["arms"][a][key]["mean"] for a in arms]
    stds = [report["arms"][a][key]["std"] for a in arms]
    xs = list(range(len(arms)))
    # The error bar stops at 0 (no negative GPU-hours or steps) and the axis holds its top.
    lower = [min(s or 0.0, m or 0.0) for s, m in zip(stds, means)]
    ax.bar(xs, [m or 0.0 for m in means], width=0.6, color="#c6dbef", edgecolor="#3182bd", zorder=1,
           yerr=[lower, [s or 0.0 for s in stds]], capsize=6, error_kw={"ecolor": "#3182bd", "zorder": 2})
    width = 0.36
    for i, arm in enumerate(arms):
        per_seed = report["arms"][arm]["per_seed"]
        for j, s in enumerate(seeds):
            v = per_seed.get(s, {}).get(key)
            if v is None:
                continue
            dx = (j - (len(seeds) - 1) / 2) * (width / max(1, len(seeds) - 1)) if len(seeds) > 1 else 0.0
            ax.scatter(i + dx, v, s=36, color=colour[s], edgecolor="black", linewidth=0.5, zorder=3,
                       label=f"seed {s}")
        m = means[i]
        if m is not None:
            ax.text(i, m / 2, "mean\n" + fmt(m), ha="center", va="center", fontsize=10,
                    color="#08306b", fontweight="bold", zorder=4)
    labels = []
    for a in arms:
        st = report["arms"][a][key]
        extra = f"\nn={st['n']}"
        if show_total:
            extra += f", total {fmt(report['arms'][a][key]['total'])}"
        labels.append(a + (" (baseline)" if a == report.get("baseline") else "") + extra)
    ax.set_xticks(xs, labels, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.set_axisbelow(True)
    top = max([v for a in arms for v in _seed_values(report, a, key)]
              + [(m or 0) + (s or 0) for m, s in zip(means, stds)] + [0])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    _tidy_axis(ax.yaxis, 0, top * 1.15 if top > 0 else 1)
    handles, names = ax.get_legend_handles_labels()
    if handles:
        uniq = dict(zip(names, handles))
        ax.legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                  title="one point per run", title_fontsize=8)
    fig.supxlabel(footer, fontsize=8, color="#555555")
    fig.savefig(path)
    return path


def _seed_values(report: Mapping[str, Any], arm: str, key: str) -> Sequence[float]:
    return [v[key] for v in report["arms"][arm]["per_seed"].values() if v.get(key) is not None]


def write_plots(report: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write gpu_hours_per_arm.png and steps_per_arm.png into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if not report["arms"]:
        log.info("report of %s has no runs: no plots", report["experiment"])
        return []
    name = f"{report['experiment']} v{report['version']}"
    t = report["totals"]
    decided = t["decided_not_spent_gpu_hours"]
    footer = (f"bars: mean, error bars: sample std, points: one run per seed.\nSpent {fmt(t['spent_gpu_hours'])} "
              f"GPU-h in {t['attempts']} attempts; decided not spent: "
              f"{'unknown' if decided is None else fmt(decided)} GPU-h.")
    paths = [
        _bar_plot(report, "allocated_gpu_hours", ylabel="allocated GPU-hours per run (through evaluation)",
                  title=f"{name}: GPU-hours per arm ({report['gpus']} GPUs x elapsed / 3600)",
                  footer=footer, path=out / "gpu_hours_per_arm.png", show_total=True),
        _bar_plot(report, "steps", ylabel="optimizer steps in the loop budget (succeeded runs)",
                  title=f"{name}: steps per arm under the equal loop-time budget",
                  footer=footer, path=out / "steps_per_arm.png", show_total=False),
    ]
    if any(a.get("outcome_runs") for a in report["arms"].values()):
        paths.append(_outcome_plot(report, out / "outcome_per_arm.png", name))
    if any(m in d for d in report.get("paired_vs_baseline", {}).values() for m in OUTCOME_METRICS):
        paths.append(_forest_plot(report, out / "paired_differences.png", name))
    log.info("wrote %s", ", ".join(str(p) for p in paths))
    return paths


def _new_figure(width: float, height: float):  # type: ignore[no-untyped-def]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _ci_text(st: Mapping[str, Any], signed: bool = False, digits: int = 3) -> str:
    """"mean [low, high]" with a fixed number of decimals (rewards: 3)."""
    def f(v: float) -> str:
        return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"

    ci = st.get("ci95")
    return f"{f(st['mean'])} [{f(ci[0])}, {f(ci[1])}]" if ci else f"{f(st['mean'])} (n={st['n']}, no interval)"


def _method_text(sts: Sequence[Mapping[str, Any]]) -> str:
    methods = sorted({s.get("ci95_method") for s in sts if s.get("ci95_method")})
    names = {"t": "Student t, n-1 df", "bootstrap_bca": "BCa bootstrap over seeds"}
    return " / ".join(names.get(m, m) for m in methods) or "none (n < 2)"


def _outcome_plot(report: Mapping[str, Any], path: Path, name: str) -> Path:
    """One panel per outcome metric: per arm the runs' values (one point per seed), the mean (a black
    bar) and its 95 % interval (a vertical line with caps)."""
    arms = _arm_order(report)
    metrics = [m for m in OUTCOME_METRICS if any(report["arms"][a]["outcome"][m]["n"] for a in arms)]
    seeds = sorted({s for a in arms for s in report["arms"][a]["per_seed"]})
    colour = {s: _SEED_COLOURS[i % len(_SEED_COLOURS)] for i, s in enumerate(seeds)}
    fig = _new_figure(min(18.0, max(7.5, 0.95 * len(arms) * len(metrics) + 3.0)), 5.6)
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    used = []
    lows: list[float] = []
    highs: list[float] = []
    for ax, m in zip(axes, metrics):
        for i, arm in enumerate(arms):
            st = report["arms"][arm]["outcome"][m]
            pts = [(s, v.get(m)) for s, v in report["arms"][arm]["per_seed"].items() if v.get(m) is not None]
            for j, (s, v) in enumerate(sorted(pts)):
                dx = (j - (len(pts) - 1) / 2) * 0.12
                ax.scatter(i + 0.18 + dx, v, s=30, color=colour[s], edgecolor="black", linewidth=0.5, zorder=3,
                           label=f"seed {s}")
                lows.append(v)
                highs.append(v)
            if st["mean"] is None:
                continue
            used.append(st)
            ax.hlines(st["mean"], i - 0.22, i + 0.02, color="black", linewidth=2.2, zorder=4)
            if st["ci95"]:
                lo, hi = st["ci95"]
                ax.vlines(i - 0.1, lo, hi, color="#08519c", linewidth=1.6, zorder=2)
                ax.hlines([lo, hi], i - 0.16, i - 0.04, color="#08519c", linewidth=1.6, zorder=2)
                lows.append(lo)
                highs.append(hi)
        for i, arm in enumerate(arms):
            if not report["arms"][arm]["outcome"][m]["n"]:
                ax.text(i, 0.02, "none", transform=ax.get_xaxis_transform(), ha="center", fontsize=8, color="#888888")
        ax.set_xticks(range(len(arms)), [a + ("\n(baseline)" if a == report.get("baseline") else "")
                                         + f"\nn={report['arms'][a]['outcome'][m]['n']}" for a in arms], fontsize=8)
        ax.set_title(METRIC_LABELS[m], fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
        ax.set_xlim(-0.6, len(arms) - 0.4)
    if lows:  # one scale for every panel (shared), holding every point and interval end
        lo, hi = min(lows + [0.0]), max(highs)
        pad = 0.06 * (hi - lo or 1.0)
        axes[0].set_ylim(lo - pad if lo < 0 else 0.0, hi + pad)
        _tidy_axis(axes[0].yaxis, lo - pad if lo < 0 else 0.0, hi + pad)
    axes[0].set_ylabel("mean verifier reward per run (0-1)")
    handles, names = axes[0].get_legend_handles_labels()
    if handles:
        uniq = dict(zip(names, handles))
        axes[-1].legend(uniq.values(), uniq.keys(), loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
                        title="one point per run", title_fontsize=8)
    dec = sorted({d for a in arms for d in report["arms"][a].get("decoding", [])})
    items = [report["arms"][a]["eval_items"]["mean"] for a in arms if report["arms"][a]["eval_items"]["n"]]
    n_items = f"{max(items):g} held-out items per run" if items else "items unknown"
    fig.suptitle(f"{name}: evaluation outcome per arm ({', '.join(dec) or 'decoding unknown'} decoding, {n_items})",
                 x=0.01, ha="left", fontsize=11)
    fig.supxlabel(f"black bar: mean over runs; blue: its 95 % interval ({_method_text(used)}); points: one run per "
                  f"seed. Exposed = items the run actually trained on.", fontsize=8, color="#555555")
    fig.savefig(path)
    return path


def _forest_plot(report: Mapping[str, Any], path: Path, name: str) -> Path:
    """Arm - baseline per outcome metric, paired by seed on the same items: a point at the mean
    difference, a line over its 95 % interval, small dots for the per-seed differences, 0 dashed."""
    base = report["baseline"]
    paired = report["paired_vs_baseline"]
    arms = [a for a in _arm_order(report) if a in paired]
    metrics = [m for m in OUTCOME_METRICS if any(m in paired[a] for a in arms)]
    fig = _new_figure(max(8.0, 3.6 * len(metrics) + 1.5), 1.0 + 0.75 * len(arms) + 1.2)
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    used = []
    for ax, m in zip(axes, metrics):
        xs = [0.0]
        for i, arm in enumerate(arms):
            y = len(arms) - 1 - i
            d = paired[arm].get(m)
            if not d or d["mean"] is None:
                ax.text(0, y, "no pairs", ha="center", va="center", fontsize=8, color="#888888")
                continue
            used.append(d)
            per = list(d["per_seed"].values())
            ax.scatter(per, [y + 0.18] * len(per), s=14, color="#777777", zorder=2, label="one seed's difference")
            xs += per
            if d["ci95"]:
                lo, hi = d["ci95"]
                ax.hlines(y, lo, hi, color="#08519c", linewidth=2.0, zorder=3)
                ax.vlines([lo, hi], y - 0.12, y + 0.12, color="#08519c", linewidth=2.0, zorder=3)
                xs += [lo, hi]
            ax.scatter([d["mean"]], [y], s=60, marker="D", color="#cb181d", edgecolor="black", linewidth=0.5,
                       zorder=4, label="mean difference")
            ax.annotate(_ci_text(d, signed=True) + f"  n={d['n']}", (0.5, y - 0.32), xycoords=("axes fraction", "data"),
                        ha="center", va="center", fontsize=7.5, color="#333333")
        lo, hi = min(xs), max(xs)
        pad = 0.1 * (hi - lo or 0.1)
        ax.set_xlim(lo - pad, hi + pad)
        ax.axvline(0, color="black", linestyle="--", linewidth=0.8, zorder=1)
        ax.set_ylim(-0.7, len(arms) - 0.4)
        ax.set_title(f"Δ {METRIC_LABELS[m]}", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        _tidy_axis(ax.xaxis, lo - pad, hi + pad, signed=True, nbins=5)
    axes[0].set_yticks(range(len(arms)), list(reversed(arms)), fontsize=9)
    shared_legend(axes)
    fig.suptitle(f"{name}: arm - {base}, paired by seed, on the same items (reward)", x=0.01, ha="left",
                 fontsize=11)
    fig.supxlabel(f"diamond: mean difference; line: 95 % interval ({_method_text(used)}); grey: per seed; each "
                  f"panel has its own scale. An interval clear of the dashed 0 line is a difference the seeds "
                  f"support.", fontsize=8,
                  color="#555555")
    fig.savefig(path)
    return path
