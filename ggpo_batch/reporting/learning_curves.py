"""Learning curves of an experiment: each run's per-step figures against its loop seconds, and per
arm their mean over seeds with a band (the lowest and highest seed) on a common loop-time grid.

Finished runs' curves come from the ledger (`curve_points`, booked by settlement: a few queries
whatever the count of runs); with `jobs_dir`, the curves of runs still training come from the curve
file their job appends to (ggpo_batch/contracts/curve.py), so the dashboard's curves grow while they train.
`report --plot` draws the arms' curves (curve_plots.py), the dashboard the same as SVG.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contracts.curve import read_curve
from ..contracts.run_record import audit_failed
from ..errors import LedgerError
from ..ledger import Ledger
from ..ledger.schema import Run

# What report and dashboard draw against loop seconds.
CURVE_METRICS = ("mean_reward", "kl")
METRIC_LABELS = {"mean_reward": "mean reward per step", "kl": "KL to the reference (token mean)"}
GRID_POINTS = 100  # loop-time points of an arm's curve
LIVE_RUNS_MAX = 64  # running runs whose curve files one view reads at most


@dataclass(frozen=True)
class RunCurve:
    """One run's curve: loop seconds and, per metric, the value at each step (None where unknown)."""

    run_key: str
    arm: str
    seed: int
    state: str
    source: str  # "ledger" (booked) | "live" (the running job's file)
    steps: list[int]
    loop_seconds: list[float | None]
    values: dict[str, list[float | None]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"run_key": self.run_key, "arm": self.arm, "seed": self.seed, "state": self.state, "source": self.source,
                "points": len(self.steps), "last_step": self.steps[-1] if self.steps else None,
                "last_loop_seconds": next((t for t in reversed(self.loop_seconds) if t is not None), None)}


def _comparable(run: Run) -> bool:
    return run.state == "succeeded" and not audit_failed(run.result)


def experiment_curves(ledger: Ledger, name: str, version: int | None = None, *, jobs_dir: Path | None = None,
                      metrics: Sequence[str] = CURVE_METRICS) -> dict[str, Any]:
    """{"experiment", "version", "metrics", "runs": [RunCurve.summary()], "arms": {arm: {metric:
    arm_curve}}} over the version's succeeded runs (audit passed) and, with `jobs_dir`, its running ones."""
    versions = ledger.experiments(name)
    exp = versions[-1] if version is None else next((e for e in versions if e.version == version), None)
    if exp is None:
        raise LedgerError(f"no experiment {name!r}" + (f" version {version}" if version is not None else "")
                          + " in the ledger")
    runs = ledger.runs(experiment_id=exp.id, states=["succeeded", "running"] if jobs_dir else ["succeeded"])
    curves = run_curves(ledger, exp.id, runs, jobs_dir=jobs_dir, metrics=metrics)
    return {"experiment": exp.name, "version": exp.version, "metrics": list(metrics),
            "runs": [c.summary() for c in curves], "arms": arm_curves(curves, metrics)}


def run_curves(ledger: Ledger, experiment_id: int, runs: Sequence[Run], *, jobs_dir: Path | None = None,
               metrics: Sequence[str] = CURVE_METRICS) -> list[RunCurve]:
    """The curves of `runs`: a running run's from its job's file (with `jobs_dir`), a comparable
    finished run's from the ledger."""
    out: dict[str, RunCurve] = {}
    if jobs_dir is not None:
        from .joblogs import job_folder

        live = [r for r in runs if r.state == "running" and r.attempts and r.attempts[-1].state == "running"]
        for run in live[:LIVE_RUNS_MAX]:
            points = read_curve(job_folder(jobs_dir, run, run.attempts[-1]))
            if points:
                out[run.run_key] = RunCurve(run.run_key, run.arm, run.seed, run.state, "live",
                                            [p["step"] for p in points], [p["loop_seconds"] for p in points],
                                            {m: [p.get(m) for p in points] for m in metrics})
    booked = {r.id: r for r in runs if _comparable(r)}
    if booked:
        for run_id, cols in ledger.curves(experiment_id, ("loop_seconds", *metrics), run_ids=booked).items():
            run = booked[run_id]
            out[run.run_key] = RunCurve(run.run_key, run.arm, run.seed, run.state, "ledger", cols["step"],
                                        cols["loop_seconds"], {m: cols[m] for m in metrics})
    return sorted(out.values(), key=lambda c: (c.arm, c.seed))


def arm_curves(curves: Iterable[RunCurve], metrics: Sequence[str] = CURVE_METRICS) -> dict[str, dict[str, Any]]:
    """Per arm and metric: the mean over its runs on a grid of loop seconds from 0 to the longest
    run's last point (and each of the arm's runs' first and last points, so that a run's whole span
    counts), with the lowest and highest run (the band) and how many runs each point has."""
    by_arm: dict[str, list[RunCurve]] = defaultdict(list)
    for c in curves:
        by_arm[c.arm].append(c)
    longest = max((t for c in by_arm.values() for r in c for t in r.loop_seconds if t is not None), default=0.0)
    grid = [longest * i / (GRID_POINTS - 1) for i in range(GRID_POINTS)] if longest > 0 else []
    out = {}
    for arm, rs in sorted(by_arm.items()):
        ends = {t for r in rs for t in _ends(r.loop_seconds)}
        out[arm] = {m: arm_curve(rs, m, sorted(ends.union(grid))) for m in metrics}
    return out


def _ends(xs: Sequence[float | None]) -> list[float]:
    known = [x for x in xs if x is not None]
    return [min(known), max(known)] if known else []


def arm_curve(runs: Sequence[RunCurve], metric: str, grid: Sequence[float]) -> dict[str, list[Any]]:
    """{"loop_seconds", "mean", "low", "high", "runs"} at the grid points some run covers (each run
    interpolated linearly between its own points, never beyond its first or last)."""
    series = [_series(r.loop_seconds, r.values.get(metric, [])) for r in runs]
    series = [s for s in series if s[0]]
    out: dict[str, list[Any]] = {"loop_seconds": [], "mean": [], "low": [], "high": [], "runs": []}
    for t in grid:
        here = [v for xs, ys in series if (v := _at(xs, ys, t)) is not None and math.isfinite(v)]
        if here:
            out["loop_seconds"].append(t)
            # Each value divided first: figures near the float limit (+-1e308) sum without overflow.
            out["mean"].append(math.fsum(v / len(here) for v in here))
            out["low"].append(min(here))
            out["high"].append(max(here))
            out["runs"].append(len(here))
    return out


def _series(xs: Sequence[float | None], ys: Sequence[float | None]) -> tuple[list[float], list[float]]:
    pairs = sorted((x, y) for x, y in zip(xs, ys) if x is not None and y is not None)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _at(xs: Sequence[float], ys: Sequence[float], t: float) -> float | None:
    if not xs or t < xs[0] or t > xs[-1]:
        return None
    i = bisect.bisect_left(xs, t)
    if xs[i] == t or i == 0:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if not x1 > x0:
        return y1
    f = (t - x0) / (x1 - x0)
    return y0 * (1 - f) + y1 * f  # not y0 + (y1 - y0) * f: y1 - y0 overflows for +-1e308


def has_points(data: Mapping[str, Any]) -> bool:
    """Is there anything to draw in `experiment_curves`' result?"""
    return any(c["mean"] for arm in data["arms"].values() for c in arm.values())
