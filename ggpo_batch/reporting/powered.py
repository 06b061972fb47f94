"""Was an experiment powered? The paired test per arm, sigma pooled over its comparisons, and the
report's `power` block: per arm the smallest difference the seeds run could detect, and, at the
`[power]` effect, the power the seeds had and what a significant result there is worth (type S:
the wrong sign; type M: the exaggeration; Gelman & Carlin 2014). Post-hoc power at the observed
difference is not shown: it is a function of the p-value and adds nothing (Hoenig & Heisey 2001).

Works on the report's own paired differences (`paired_vs_baseline[ARM][METRIC]["per_seed"]`), so the
pairing (which runs count, matched items) has one home: report.py. The [power] settings come as the
stored spec's table (a plain mapping; absent keys take the spec reference's defaults).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts import spec_fields
from . import power as pw
from . import sequential
from .fairness import warning


def settings(table: Mapping[str, Any] | None, **override: Any) -> dict[str, Any]:
    """The [power] settings: `override` (options given, not None) over the spec's table over the defaults."""
    out = {f.name: spec_fields.default(f.key) for f in spec_fields.fields_of("power")}
    out.update({k: v for k, v in (table or {}).items() if k in out})
    out.update({k: v for k, v in override.items() if v is not None})
    return out


@dataclass(frozen=True)
class Paired:
    """The paired t-test of one arm against the baseline."""

    diffs: tuple[float, ...]
    n: int
    mean: float
    sd: float
    t: float
    p: float


def paired_test(per_seed: Mapping[str, float]) -> Paired | None:
    """The two-sided paired t-test on per-seed differences (None below 2 seeds); sd 0 gives p 0 (a
    constant nonzero difference) or 1 (none), not a division error."""
    from scipy.stats import t as student

    xs = tuple(float(v) for v in per_seed.values() if v is not None and math.isfinite(v))
    n = len(xs)
    if n < 2:
        return None
    mean, sd = math.fsum(xs) / n, statistics.stdev(xs)
    if sd == 0:
        return Paired(xs, n, mean, 0.0, math.copysign(math.inf, mean) if mean else 0.0, 0.0 if mean else 1.0)
    t = mean / (sd / math.sqrt(n))
    return Paired(xs, n, mean, sd, t, float(2 * student.sf(abs(t), n - 1)))


def arm_tests(report: Mapping[str, Any], metric: str) -> dict[str, Paired]:
    """Arm -> its paired test on `metric` against the report's baseline (arms with 2 seeds or more)."""
    out = {}
    for arm, figures in sorted((report.get("paired_vs_baseline") or {}).items()):
        test = paired_test(((figures.get(metric) or {}).get("per_seed")) or {})
        if test is not None:
            out[arm] = test
    return out


def pooled(tests: Mapping[str, Paired]) -> tuple[float, int] | None:
    """(sd, df) of the differences pooled over the arms' comparisons; None without any df."""
    return pw.pooled_sd([(t.sd, t.n - 1) for t in tests.values()])


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def power_block(report: Mapping[str, Any], table: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The report's `power` block and its `underpowered` warnings (only under a declared [power] table)."""
    s = settings(table)
    tests = arm_tests(report, s["metric"])
    if not tests:
        return {}, []
    alpha_arm = pw.alpha_per_arm(s["alpha"], len(report.get("paired_vs_baseline") or {}), s["multiplicity"])
    pool = pooled(tests)
    given = s["sigma"] if not isinstance(s["sigma"], str) else None
    sigma, df, source = ((given, None, "spec") if given is not None
                         else (pool[0], pool[1], "this experiment's comparisons") if pool else (None, None, None))
    effect = s["effect"] if s["effect"] is not None else (
        s["effect_sd"] * sigma if s["effect_sd"] is not None and sigma else None)
    arms: dict[str, Any] = {}
    warnings: list[dict[str, Any]] = []
    bounds = design_bounds(s, alpha_arm) if table is not None else None
    for arm, t in tests.items():
        mde_sd = pw.mde(t.n, s["power"], alpha_arm)
        row: dict[str, Any] = {"n": t.n, "mde_sd": _finite(mde_sd), "mde": _finite(mde_sd * sigma) if sigma else None,
                               "power_at_effect": None, "type_s": None, "type_m": None,
                               "look": sequential.look(t.diffs, s["waves"], bounds).as_dict() if bounds else None}
        if effect and sigma:
            e = pw.design_errors(effect / sigma, t.n, alpha_arm)
            row.update(power_at_effect=e.power, type_s=_finite(e.type_s), type_m=_finite(e.type_m))
            if table is not None and e.power < s["power"]:
                warnings.append(warning("underpowered", [arm], (
                    f"{arm}: {t.n} seeds had power {e.power:.2f} to detect the declared effect {effect:g} "
                    f"{s['metric']} (target {s['power']:g}); they detect |difference| >= {mde_sd * sigma:.3g}; a "
                    f"significant estimate there exaggerates {e.type_m:.2f}x on average (type M)")))
        elif table is not None and sigma and abs(t.mean) < mde_sd * sigma and t.p < s["alpha"]:
            warnings.append(warning("underpowered", [arm], (
                f"{arm}: significant at {t.mean:.3g} {s['metric']}, below the {mde_sd * sigma:.3g} that {t.n} seeds "
                f"reliably detect: the estimate is likely exaggerated (type M)")))
        arms[arm] = row
    block = {"metric": s["metric"], "alpha": s["alpha"], "alpha_per_arm": alpha_arm, "multiplicity": s["multiplicity"],
             "power": s["power"], "effect": effect, "declared": table is not None,
             "sigma": {"value": sigma, "df": df, "source": source}, "arms": arms}
    return block, warnings


def design_bounds(s: Mapping[str, Any], alpha_arm: float) -> list[float] | None:
    """The |t| boundaries of a sequential [power] design at the per-arm level (None: a fixed design)."""
    if s["design"] != "sequential" or not s["waves"]:
        return None
    return sequential.boundaries(list(s["waves"]), alpha_arm, s["spending"])


def recorded_looks(looks: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Arm -> its latest look as reconcile recorded it (ledger `looks`), in the shape of
    `sequential.Look.as_dict()`, with the recorded `decision` and `reason` beside it."""
    out: dict[str, dict[str, Any]] = {}
    for lk in looks:
        waves = list(lk["waves"] or [])
        go_on = lk["decision"] == "continue" and lk["look"] < len(waves)
        out[lk["arm"]] = {"look": lk["look"], "looks": lk["looks"], "seeds": lk["seeds_paired"], "t": lk["statistic"],
                          "boundary": lk["boundary"], "crossed": lk["decision"] == "crossed",
                          "futile": lk["decision"] == "futile", "next_wave": waves[lk["look"]] if go_on else None,
                          "decision": lk["decision"], "reason": lk["reason"]}
    return out


def with_recorded(block: dict[str, Any], looks: Sequence[Mapping[str, Any]]) -> None:
    """The power block's looks replaced by those reconcile recorded (the decisions taken), where it
    recorded any: the same keys, so the JSON keeps its shape."""
    for arm, lk in recorded_looks(looks).items():
        row = (block.get("arms") or {}).get(arm)
        if row is not None:
            row["look"] = {k: v for k, v in lk.items() if k not in ("decision", "reason")}


def look_label(lk: Mapping[str, Any] | None) -> str:
    """` (look k of K)`: how an interval taken under a sequential design is labelled; empty otherwise."""
    return f" (look {lk['look']} of {lk['looks']})" if lk and lk.get("look") else ""


def summary_lines(block: Mapping[str, Any]) -> list[str]:
    """The power block as text lines for the report."""
    if not block:
        return []
    sig = block["sigma"]
    head = (f"power ({block['metric']}, alpha {block['alpha']:g} -> {block['alpha_per_arm']:.4g} per arm, "
            f"{block['power']:.0%}): sigma of the differences "
            + (f"{sig['value']:.4g} ({sig['source']}" + (f", {sig['df']} df)" if sig["df"] else ")")
               if sig["value"] is not None else "unknown"))
    lines = [head]
    for arm, r in block["arms"].items():
        text = f"  {arm}: {r['n']} seeds detect |difference| >= " + (
            f"{r['mde']:.4g}" if r["mde"] is not None else f"{r['mde_sd']:.3g} sd" if r["mde_sd"] else "nothing")
        lk = r.get("look")
        if lk and lk["look"]:
            text += (f"; look {lk['look']} of {lk['looks']} ({lk['seeds']} seeds): |t| {abs(lk['t'] or 0):.3g} "
                     + (f"vs boundary {lk['boundary']:.3g}" if lk["boundary"] else "(this look cannot reject)")
                     + (", crossed" if lk["crossed"] else ""))
        if r["power_at_effect"] is not None:
            text += (f"; at the effect {block['effect']:.4g}: power {r['power_at_effect']:.2f}, type S "
                     f"{r['type_s'] or 0:.3f}, type M {r['type_m'] or math.nan:.2f}")
        lines.append(text)
    if any((r.get("look") or {}).get("look") for r in block["arms"].values()):
        lines.append("  sequential design: an interval labelled (look k of K) is the fixed-sample 95 % interval at that "
                     "look; what stops an arm is its look's boundary, not the interval")
    return lines


def verdict_inputs(tests: Mapping[str, Paired], multiplicity: str) -> dict[str, float]:
    """Arm -> its p-value adjusted over the family of arms."""
    arms: Sequence[str] = list(tests)
    return dict(zip(arms, pw.adjust([tests[a].p for a in arms], multiplicity)))
