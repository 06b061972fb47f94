"""The learning-curve panels of the experiment page as SVG geometry: per metric, per arm the band
(lowest to highest seed) as a polygon and the mean over seeds as a polyline, in the panel's pixel
coordinates, with axis ticks. Every figure comes from reporting/learning_curves.py; the template
(_curves.html) only places them, so the page needs no script and no image."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..reporting.curve_plots import arm_colours
from ..reporting.learning_curves import METRIC_LABELS

WIDTH, HEIGHT = 540, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 36  # margins for the axes' labels


def curve_panels(curves: Mapping[str, Any], baseline: str | None = None) -> list[dict[str, Any]]:
    """One panel per metric: {"metric", "label", "width", "height", "plot" (x, y, w, h), "xticks",
    "yticks" ([(pixel, label)]), "arms": [{"arm", "colour", "band", "mean", "points", "runs", "dots"}]}; an
    arm's curve of three points or fewer is drawn as dots too (one point draws no line)."""
    arms = sorted(curves["arms"])
    colour = arm_colours(arms, baseline)
    out = []
    for m in curves["metrics"]:
        series = {a: curves["arms"][a][m] for a in arms if curves["arms"][a][m]["mean"]}
        xs = [x for c in series.values() for x in c["loop_seconds"]]
        ys = [y for c in series.values() for y in c["low"] + c["high"]]
        panel: dict[str, Any] = {"metric": m, "label": METRIC_LABELS.get(m, m), "width": WIDTH, "height": HEIGHT,
                                 "plot": (LEFT, TOP, WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM),
                                 "xticks": [], "yticks": [], "arms": []}
        if xs:
            x_hi = max(xs) or 1.0
            y_lo, y_hi = min(ys), max(ys)
            if y_hi - y_lo < 1e-12:
                y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
            fx = _scale(0.0, x_hi, LEFT, WIDTH - RIGHT)
            fy = _scale(y_lo, y_hi, HEIGHT - BOTTOM, TOP)
            panel["xticks"] = [(fx(t), _label(t, xt)) for t, xt in _ticks(0.0, x_hi)]
            panel["yticks"] = [(fy(t), _label(t, yt)) for t, yt in _ticks(y_lo, y_hi)]
            for arm, c in series.items():
                upper = [f"{fx(x):.1f},{fy(y):.1f}" for x, y in zip(c["loop_seconds"], c["high"])]
                lower = [f"{fx(x):.1f},{fy(y):.1f}" for x, y in zip(reversed(c["loop_seconds"]), reversed(c["low"]))]
                panel["arms"].append({"arm": arm, "colour": colour[arm], "band": " ".join(upper + lower),
                                      "mean": " ".join(f"{fx(x):.1f},{fy(y):.1f}"
                                                       for x, y in zip(c["loop_seconds"], c["mean"])),
                                      "points": len(c["mean"]), "runs": max(c["runs"]),
                                      "dots": [(round(fx(x), 1), round(fy(y), 1))
                                               for x, y in zip(c["loop_seconds"], c["mean"])]
                                      if len(c["mean"]) <= 3 else []})
        out.append(panel)
    return out


def _scale(lo: float, hi: float, a: float, b: float):  # type: ignore[no-untyped-def]
    # Halved first: hi - lo overflows for figures near the float limit (+-1e308).
    span = (hi / 2 - lo / 2) or 1.0
    return lambda v: a + (v / 2 - lo / 2) / span * (b - a)


def _ticks(lo: float, hi: float, count: int = 5) -> list[tuple[float, float]]:
    """Ticks at 1-2-5 multiples within [lo, hi], each with its spacing (for the label's decimals)."""
    raw = (hi / count - lo / count) if hi > lo else 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 5, 10) if s * mag >= raw)
    first = math.ceil(lo / step) * step
    n = min(math.floor((hi / step - first / step) + 1e-9) + 1, 4 * count)
    return [(first + i * step, step) for i in range(max(0, n))]


def _label(v: float, step: float) -> str:
    if abs(v) >= 1e15:
        return f"{v:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{0.0 if abs(v) < step / 2 else v:,.{decimals}f}"


def legend(curves: Mapping[str, Any], baseline: str | None = None) -> Sequence[dict[str, Any]]:
    """Per arm its colour and how many runs its curves hold (booked, and live ones training now)."""
    arms = sorted(curves["arms"])
    colour = arm_colours(arms, baseline)
    return [{"arm": a, "colour": colour[a], "runs": sum(1 for r in curves["runs"] if r["arm"] == a),
             "live": sum(1 for r in curves["runs"] if r["arm"] == a and r["source"] == "live")} for a in arms]
