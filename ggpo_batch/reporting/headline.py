"""An experiment report in one line, for a notification: how its runs ended, what they cost, and
the main outcome (reward on held-out items) of up to three arms against the baseline, paired by
seed, with its 95 % interval; the warnings counted. Nothing here computes a statistic."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..contracts.outcome import OUTCOME_METRICS
from .render import ci

MAIN_METRIC = OUTCOME_METRICS[0]  # reward on every held-out item
MAX_ARMS = 3


def headline(report: Mapping[str, Any]) -> str:
    """`NAME vN finished: 10 runs (9 succeeded, 1 failed), 1.2 GPU-h; eval_reward vs clean: a +0.05 [...]`."""
    states: Counter[str] = Counter()
    for arm in report["arms"].values():
        states.update(arm["states"])
    totals = report["totals"]
    ended = ", ".join(f"{n} {s}" for s, n in sorted(states.items(), key=lambda kv: (-kv[1], kv[0])))
    name = report["experiment"] + (f" v{report['version']}" if report.get("version") is not None else "")
    line = f"{name} finished: {totals['runs']} runs ({ended}), {totals['spent_gpu_hours']:.3g} GPU-h"
    line += _outcome(report)
    if report.get("warnings"):
        line += f"; {len(report['warnings'])} comparability warning(s) in its report"
    return line


def _outcome(report: Mapping[str, Any]) -> str:
    base = report.get("baseline")
    if base:
        diffs = [(arm, d[MAIN_METRIC]) for arm, d in report["paired_vs_baseline"].items()
                 if d.get(MAIN_METRIC, {}).get("mean") is not None]
        diffs.sort(key=lambda ad: -ad[1]["mean"])
        if diffs:
            return f"; {MAIN_METRIC} vs {base}: " + ", ".join(f"{arm} {ci(d, None, signed=True)}"
                                                            for arm, d in diffs[:MAX_ARMS])
    means = [(arm, a["outcome"][MAIN_METRIC]) for arm, a in report["arms"].items()
             if (a.get("outcome") or {}).get(MAIN_METRIC, {}).get("mean") is not None]
    means.sort(key=lambda am: -am[1]["mean"])
    if means:
        return f"; {MAIN_METRIC}: " + ", ".join(f"{arm} {ci(m, None)}" for arm, m in means[:MAX_ARMS])
    return ""
