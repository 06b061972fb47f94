"""PNG plots of an experiment report: GPU-hours per arm with per-seed points, steps per arm.

Drawn from the report dict only (nothing recomputed), with matplotlib's object API and the Agg
canvas, so no global pyplot state and no display is needed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_SEED_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def _arm_order(report: Mapping[str, Any]) -> list[str]:
    arms = sorted(report["arms"])
    base = report.get("baseline")
    return ([base] if base in arms else []) + [a for a in arms if a != base]


def _bar_plot(report: Mapping[str, Any], key: str, *, ylabel: str, title: str, value_fmt: str,
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
    ax.bar(xs, [m or 0.0 for m in means], width=0.6, color="#c6dbef", edgecolor="#3182bd", zorder=1,
           yerr=[s or 0.0 for s in stds], capsize=6, error_kw={"ecolor": "#3182bd", "zorder": 2})
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
            ax.text(i, m / 2, "mean\n" + value_fmt.format(m), ha="center", va="center", fontsize=10,
                    color="#08306b", fontweight="bold", zorder=4)
    labels = []
    for a in arms:
        st = report["arms"][a][key]
        extra = f"\nn={st['n']}"
        if show_total:
            extra += f", total {report['arms'][a][key]['total']:.2f}"
        labels.append(a + (" (baseline)" if a == report.get("baseline") else "") + extra)
    ax.set_xticks(xs, labels, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, loc="left", fontsize=11)
    ax.grid(axis="y", alpha=0.3, zorder=0)
    ax.set_axisbelow(True)
    top = max([v for a in arms for v in _seed_values(report, a, key)] + [m or 0 for m in means] + [0])
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
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
    footer = (f"bars: mean, error bars: sample std, points: one run per seed.\nSpent {t['spent_gpu_hours']:.2f} "
              f"GPU-h in {t['attempts']} attempts; decided not spent: "
              f"{'unknown' if decided is None else f'{decided:.2f}'} GPU-h.")
    paths = [
        _bar_plot(report, "allocated_gpu_hours", ylabel="allocated GPU-hours per run (through evaluation)",
                  title=f"{name}: GPU-hours per arm ({report['gpus']} GPUs x elapsed / 3600)", value_fmt="{:.2f}",
                  footer=footer, path=out / "gpu_hours_per_arm.png", show_total=True),
        _bar_plot(report, "steps", ylabel="optimizer steps in the loop budget (succeeded runs)",
                  title=f"{name}: steps per arm under the equal loop-time budget", value_fmt="{:.1f}",
                  footer=footer, path=out / "steps_per_arm.png", show_total=False),
    ]
    log.info("wrote %s", ", ".join(str(p) for p in paths))
    return paths
