"""Before enqueue: how many seeds each arm needs against the baseline, what they cost, and whether
the spec's own seeds can detect the effect at all (`ggpo-batch plan`; writes nothing).

Per arm: the seeds the effect needs (paired by seed, two-sided t, exact noncentral-t power,
reporting/power.py) at the level each arm is planned at (alpha / arms under Holm or Bonferroni), the
robust count at sigma's 80 % upper confidence limit, the GPU-hours (the cost guard's own per-run
estimate x seeds; the baseline's seeds are shared, so the experiment costs sum_A n_A g_A + max_A n_A g_C),
and the smallest difference the spec's seeds detect. Sigma: `--sigma`, the [power] table's, or
pooled from the ledger (reporting/variance.py). A sequential design adds its waves' exact t
boundaries (reporting/sequential.py), its power and the expected seeds and GPU-hours by simulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..config.settings import Settings
from ..errors import SpecError
from ..ledger import Ledger
from ..reporting import power as pw
from ..reporting import sequential
from ..reporting.powered import settings as power_settings
from ..reporting.variance import Sigma, ledger_sigma
from ..spec.experiment import ExperimentSpec
from . import costguard


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _sigma(ledger: Ledger, spec: ExperimentSpec, s: dict[str, Any],
           sources: Sequence[tuple[str, int | None]] | None) -> Sigma | None:
    if not isinstance(s["sigma"], str):
        return Sigma(float(s["sigma"]), None, "given")
    return ledger_sigma(ledger, method=spec.method, metric=s["metric"], only=sources)


def plan(ledger: Ledger, settings: Settings, spec: ExperimentSpec, *, metric: str | None = None,
         effect: float | None = None, effect_sd: float | None = None, power: float | None = None,
         alpha: float | None = None, sigma: float | str | None = None,
         sources: Sequence[tuple[str, int | None]] | None = None, user: str, queue: str | None = None) -> dict[str, Any]:
    """The plan of `spec` (module docstring) as data: the `plan --json` document without its number."""
    table = spec.power.__dict__ if spec.power is not None else None
    if effect is not None or effect_sd is not None:  # an option replaces the spec's effect, in either form
        table = {**(table or {}), "effect": None, "effect_sd": None}
    s = power_settings(table, metric=metric, effect=effect, effect_sd=effect_sd, power=power, alpha=alpha, sigma=sigma)
    if s["effect"] is not None and s["effect_sd"] is not None:
        raise SpecError(spec.path, "power.effect_sd", "give effect (in the metric's units) or effect_sd, not both")
    base = spec.baseline_arm
    arms = [a.name for a in spec.arms if a.name != base]
    alpha_arm = pw.alpha_per_arm(s["alpha"], len(arms), s["multiplicity"])
    sig = _sigma(ledger, spec, s, sources)
    if sig is None and s["effect"] is not None:  # without one, what the seeds detect is said in sds
        raise SpecError(spec.path, "power.sigma", f"no earlier runs of {spec.method} with {s['metric']} paired by seed "
                        "in the ledger: give --sigma NUMBER ([power] sigma = NUMBER) or run a pilot")
    sd = sig.value if sig is not None else None
    if s["effect_sd"] is not None:
        dz, units = s["effect_sd"], s["effect_sd"] * sd if sd else None
    elif s["effect"] is not None and sd is not None:
        dz, units = (s["effect"] / sd if sd > 0 else math.inf), s["effect"]
    else:
        dz, units = None, None
    need = pw.seeds_needed(dz, s["power"], alpha_arm) if dz is not None else None
    robust = need
    if dz is not None and sig is not None and sig.df and s["effect_sd"] is None and sd:
        robust = pw.seeds_robust(s["effect"], sd, sig.df, s["power"], alpha_arm)
    one_seed = costguard.estimate(ledger, spec, spec.expand(1, seeds=[spec.seeds[0]]))
    per_run = {e.run_key.rsplit("-", 1)[-1]: e.gpu_hours for e in one_seed.runs}  # arm names hold no '-'
    n_spec = len(spec.seeds)
    mde_sd = pw.mde(n_spec, s["power"], alpha_arm)

    def cost(n: int | None) -> float | None:
        return None if n is None else n * math.fsum(per_run.values())

    rows = {a: {"seeds": need, "seeds_robust": robust, "gpu_hours_per_run": per_run[a],
                "gpu_hours": need * per_run[a] if need is not None else None,
                "gpu_hours_robust": robust * per_run[a] if robust is not None else None,
                "mde_at_spec_seeds": _finite(mde_sd * sd) if sd else None, "mde_sd_at_spec_seeds": _finite(mde_sd)}
            for a in arms}
    total = cost(need)
    caps = None
    if total is not None:
        est = costguard.Estimate(runs=(), total_gpu_hours=total, cost_type=one_seed.cost_type,
                                 cost_basis=one_seed.cost_basis)
        caps = costguard.check_caps(ledger, spec, est, settings=settings, user=user,
                                    queue=queue or settings.queue_for(spec.queue))
    out: dict[str, Any] = {
        "spec": spec.path, "experiment": spec.name, "metric": s["metric"], "direction": s["direction"],
        "baseline": base, "arms_compared": len(arms), "alpha": s["alpha"], "alpha_per_arm": alpha_arm,
        "multiplicity": s["multiplicity"], "power": s["power"], "effect": units, "effect_sd": _finite(dz) if dz else dz,
        "sigma": sig.as_dict() if sig is not None else None, "spec_seeds": n_spec,
        "mde_at_spec_seeds": {"value": _finite(mde_sd * sd) if sd else None, "sd": _finite(mde_sd)},
        "arms": rows, "baseline_row": {"seeds": need, "seeds_robust": robust, "gpu_hours_per_run": per_run[base],
                                       "gpu_hours": need * per_run[base] if need is not None else None,
                                       "gpu_hours_robust": robust * per_run[base] if robust is not None else None},
        "total": {"seeds": need, "seeds_robust": robust, "gpu_hours": total, "gpu_hours_robust": cost(robust),
                  "gpu_hours_at_spec_seeds": cost(n_spec), "max_gpu_hours": spec.max_gpu_hours,
                  "within_caps": caps.ok if caps else None, "caps": caps.message if caps else None},
        "cost_basis": one_seed.cost_basis, "design": _design(spec, s, alpha_arm, dz, per_run)}
    return out


def _design(spec: ExperimentSpec, s: dict[str, Any], alpha_arm: float, dz: float | None,
            per_run: dict[str, float]) -> dict[str, Any]:
    if s["design"] != "sequential" or not s["waves"]:
        return {"kind": "fixed"}
    waves = list(s["waves"])
    bounds = sequential.boundaries(waves, alpha_arm, s["spending"])
    null = sequential.operating(waves, bounds, 0.0)
    per_seed = math.fsum(per_run.values())
    out: dict[str, Any] = {"kind": "sequential", "waves": waves, "spending": s["spending"],
                           "boundaries": [_finite(c) for c in bounds], "futility": s["futility"],
                           "false_positive_rate": null.rejects, "expected_seeds_null": null.expected_seeds,
                           "expected_gpu_hours_null": null.expected_seeds * per_seed,
                           "power": None, "expected_seeds": None, "expected_gpu_hours": None,
                           "max_gpu_hours": waves[-1] * per_seed}
    if dz:
        h1 = sequential.operating(waves, bounds, min(dz, 50.0))
        out.update(power=h1.rejects, expected_seeds=h1.expected_seeds, expected_gpu_hours=h1.expected_seeds * per_seed)
    return out


def _n(x: int | None) -> str:
    return "-" if x is None else str(x)


def text(p: dict[str, Any]) -> list[str]:
    """The plan as lines for the terminal."""
    sig, m = p["sigma"], p["metric"]
    lines = []
    if sig is not None:
        src = "given" if sig["source"] == "given" else f"pooled from {'; '.join(sig['experiments'])}"
        lines.append(f"sigma of arm - {p['baseline']} ({m}): {sig['value']:.4g}, {src}")
    eff = (f"effect {p['effect']:.4g} {m} = {p['effect_sd']:.3g} sd" if p["effect"] is not None and p["effect_sd"]
           else f"effect {p['effect_sd']:.3g} sd" if p["effect_sd"] else "no effect given (--effect / [power] effect)")
    lines.append(f"alpha {p['alpha']:g} over {p['arms_compared']} arms ({p['multiplicity']}): planned at "
                 f"{p['alpha_per_arm']:.4g} per arm; power {p['power']:.2f}; {eff}")
    lines.append(f"{'arm':<20} {'seeds':>6} {'robust*':>8} {'GPU-h':>10} {'GPU-h robust':>13}")
    for arm, r in list(p["arms"].items()) + [(f"{p['baseline']} (baseline)", p["baseline_row"])]:
        gh = f"{r['gpu_hours']:.1f}" if r.get("gpu_hours") is not None else "-"
        ghr = f"{r['gpu_hours_robust']:.1f}" if r.get("gpu_hours_robust") is not None else ""
        lines.append(f"{arm:<20} {_n(r['seeds']):>6} {_n(r.get('seeds_robust', r['seeds'])):>8} {gh:>10} {ghr:>13}")
    t = p["total"]
    if t["gpu_hours"] is not None:
        extra = t["gpu_hours"] - t["gpu_hours_at_spec_seeds"]
        lines.append(f"total: {t['seeds']} seeds per arm, {t['gpu_hours']:.1f} GPU-h ({extra:+.1f} against the spec's "
                     f"{p['spec_seeds']} seeds); robust {_n(t['seeds_robust'])} seeds, {t['gpu_hours_robust']:.1f} GPU-h"
                     if t["gpu_hours_robust"] is not None else f"total: {t['gpu_hours']:.1f} GPU-h")
        lines.append(("  within caps: " if t["within_caps"] else "  OVER A CAP: ") + str(t["caps"]))
    elif p["effect_sd"] is not None:
        lines.append("total: no number of seeds detects an effect of 0" if not p["effect_sd"] else
                     f"total: more than {pw.MOST_SEEDS:,} seeds per arm")
    md = p["mde_at_spec_seeds"]
    lines.append(f"the spec's {p['spec_seeds']} seeds detect |difference| >= "
                 + (f"{md['value']:.4g} {m}" if md["value"] is not None else f"{md['sd']:.3g} sd" if md["sd"] else "nothing")
                 + f" ({p['power']:.0%}, alpha {p['alpha_per_arm']:.4g})")
    lines.append("* robust: sigma at its 80 % upper confidence limit (" + (f"{sig['df']} df)" if sig and sig["df"]
                                                                           else "none estimated: the same)"))
    d = p["design"]
    if d["kind"] == "sequential":
        bounds = ", ".join("never" if c is None else f"{c:.3g}" for c in d["boundaries"])
        lines.append(f"sequential {d['waves']}, {d['spending']} at alpha {p['alpha_per_arm']:.4g}: |t| >= {bounds}")
        if d["power"] is not None:
            lines.append(f"expected seeds {d['expected_seeds']:.1f} at the effect (power {d['power']:.2f}), "
                         f"{d['expected_seeds_null']:.1f} at no effect; expected GPU-h {d['expected_gpu_hours']:.1f} / "
                         f"{d['expected_gpu_hours_null']:.1f} (at most {d['max_gpu_hours']:.1f})")
    return lines


def one_line(p: dict[str, Any]) -> str:
    """`enqueue --dry-run`'s line: what the spec's seeds detect and what the [power] effect needs."""
    md, m = p["mde_at_spec_seeds"], p["metric"]
    if md["value"] is None and md["sd"] is None:  # one seed, or one arm: no paired interval to speak of
        head = f"power: {p['spec_seeds']} seed(s) detect no difference of {m} (a paired test needs 2 seeds and 2 arms)"
    else:
        head = (f"power: {p['spec_seeds']} seeds detect |difference| >= "
                + (f"{md['value']:.4g} {m}" if md["value"] is not None else f"{md['sd']:.3g} sd of {m}")
                + f" ({p['power']:.0%}, alpha {p['alpha_per_arm']:.4g} per arm)")
    t = p["total"]
    if t["seeds"] is None:
        return head + ("; no [power] effect declared (`ggpo-batch plan` with --effect)" if p["effect_sd"] is None
                       else "; no number of seeds reaches the [power] effect")
    return head + (f"; the [power] effect needs {t['seeds']} seeds ({t['gpu_hours'] - t['gpu_hours_at_spec_seeds']:+.1f}"
                   f" GPU-h)")


def dry_run_line(ledger: Ledger, settings: Settings, spec: ExperimentSpec, *, user: str) -> str:
    """`one_line` of the spec's plan, or why there is none (no sigma for its metric yet)."""
    try:
        return one_line(plan(ledger, settings, spec, user=user))
    except SpecError as exc:
        return f"power: {exc.problem} (`ggpo-batch plan {spec.path} --sigma NUMBER`)"
