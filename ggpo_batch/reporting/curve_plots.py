"""The learning-curves PNG of a report: per metric (learning_curves.CURVE_METRICS) one panel against
loop seconds, per arm its mean over seeds and a band from its lowest to its highest seed. Drawn from
`learning_curves.experiment_curves`' result only, with matplotlib's object API on the Agg canvas."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .learning_curves import METRIC_LABELS, has_points

ARM_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
CURVES_FILE = "learning_curves.png"


def arm_colours(arms: list[str], baseline: str | None = None) -> dict[str, str]:
    """One colour per arm, the baseline first: the PNG and the dashboard colour arms alike."""
    order = ([baseline] if baseline in arms else []) + [a for a in sorted(arms) if a != baseline]
    return {a: ARM_COLOURS[i % len(ARM_COLOURS)] for i, a in enumerate(order)}


def write_curve_plot(curves: Mapping[str, Any], out_dir: Path, baseline: str | None = None) -> Path | None:
    """learning_curves.png in `out_dir`; None when no run has a curve point to draw."""
    if not has_points(curves):
        return None
    from .plots import _new_figure, _tidy_axis, shared_legend

    metrics = curves["metrics"]
    arms = sorted(curves["arms"])
    colour = arm_colours(arms, baseline)
    fig = _new_figure(6.0 * len(metrics) + 1.5, 4.8)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    runs = {a: sum(1 for r in curves["runs"] if r["arm"] == a) for a in arms}
    for ax, m in zip(axes, metrics):
        drawn = False
        for arm in arms:
            c = curves["arms"][arm][m]
            if not c["mean"]:
                continue
            drawn = True
            ax.fill_between(c["loop_seconds"], c["low"], c["high"], color=colour[arm], alpha=0.18, linewidth=0)
            ax.plot(c["loop_seconds"], c["mean"], color=colour[arm], linewidth=1.8,
                    marker="o" if len(c["mean"]) <= 3 else None,
                    label=f"{arm}{' (baseline)' if arm == baseline else ''}, {runs[arm]} run{'s' * (runs[arm] != 1)}")
        if not drawn:
            ax.text(0.5, 0.5, "not recorded by these runs", transform=ax.transAxes, ha="center", va="center",
                    color="#888888")
            ax.set_yticks([])
        else:
            lo, hi = ax.get_ylim()
            _tidy_axis(ax.yaxis, lo, hi)
        ax.set_title(METRIC_LABELS.get(m, m), fontsize=10)
        ax.set_xlabel("loop seconds (of the equal loop-time budget)")
        ax.grid(alpha=0.3)
        ax.set_xlim(left=0)
    shared_legend(axes)
    fig.suptitle(f"{curves['experiment']} v{curves['version']}: learning curves per arm", x=0.01, ha="left",
                 fontsize=11)
    fig.supxlabel("line: mean over the arm's seeds at each loop time; band: its lowest to its highest seed "
                  "(each run interpolated between its own steps)", fontsize=8, color="#555555")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CURVES_FILE
    fig.savefig(path)
    return path
