"""After results: per arm against the baseline, is the difference established, and are more seeds
worth their GPU-hours? (`ggpo-batch advise`; read-only.)

Per arm: the paired difference of the metric with its interval and p (Holm over the arms, or the
[power] table's correction), the smallest difference the seeds run can detect, the seeds the effect
needs, and a verdict:

- stop: detected after the correction; or the seeds the effect needs have run and it was not (more
  seeds would be chasing a smaller effect than the one planned for);
- add N seeds: they cost X GPU-h (each seed one more run of the arm and of the baseline, at their
  measured GPU-h per run), fit under the cap and `max_seeds`; with the probability that the test on
  all seeds then rejects (predictive: flat prior on the mean, Jeffreys on sigma);
- not worth it: no number of seeds detects a mean difference of 0, or the seeds needed are more than
  `max_seeds`, or they cost more than the cap leaves. `ggpo-batch decide` records that.

The effect planned for is the [power] table's (the smallest worth detecting); without one, each arm's
observed difference, which carries the winner's curse (said in the output). Sigma is the sd of the
differences pooled over this experiment's comparisons (or the [power] table's / --sigma); the robust
count plans at its 80 % upper confidence limit. Extensions were not pre-planned: a test after adding
seeds chosen by looking should be a combination test (the output says so).
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import LedgerError
from ..ledger import Ledger
from . import power as pw
from . import sequential
from .powered import arm_tests, design_bounds, pooled, recorded_looks, settings, verdict_inputs
from .report import experiment_report

UNPLANNED = ("seeds added after looking were not pre-planned: judge the extended experiment with a combination "
             "test (inverse-normal, reporting/power.combined) or declare waves in [power]")


def _per_run_gpu_hours(report: dict[str, Any], arm: str) -> float | None:
    return ((report["arms"].get(arm) or {}).get("allocated_gpu_hours") or {}).get("mean")


def advise(ledger: Ledger, experiment: str, *, version: int | None = None, metric: str | None = None,
           baseline: str | None = None, outcomes: str | None = None, max_seeds: int | None = None,
           max_gpu_hours: float | None = None, sigma: float | None = None) -> dict[str, Any]:
    """The advice on one experiment version (module docstring), as data for `--json` and the text."""
    rep = experiment_report(ledger, experiment, version=version, baseline=baseline, outcomes=outcomes)
    if rep["version"] is None:
        raise LedgerError(f"{experiment} was decided, never run: nothing to advise on")
    exp = next(e for e in ledger.experiments(experiment) if e.version == rep["version"])
    table = ledger.experiment_spec(exp.id).get("power")
    s = settings(table, metric=metric, max_seeds=max_seeds, sigma=sigma)
    tests = arm_tests(rep, s["metric"])
    if not tests:
        raise LedgerError(f"{experiment} v{rep['version']}: no arm has 2 seeds of {s['metric']} paired with the "
                          f"baseline {rep['requested_baseline']!r} (a record metric such as steps: --metric steps)")
    k = len(rep["paired_vs_baseline"])
    alpha_arm = pw.alpha_per_arm(s["alpha"], k, s["multiplicity"])
    pool = pooled(tests)
    if not isinstance(s["sigma"], str):
        sd, df, source = float(s["sigma"]), None, "given"
    elif pool is not None and pool[0] > 0:
        sd, df, source = pool[0], pool[1], "pooled over this experiment's comparisons"
    else:
        sd, df, source = 0.0, pool[1] if pool else None, "pooled over this experiment's comparisons"
    declared = s["effect"] if s["effect"] is not None else (s["effect_sd"] * sd if s["effect_sd"] is not None else None)
    cap = max_gpu_hours if max_gpu_hours is not None else exp.max_gpu_hours
    spent = rep["totals"]["spent_gpu_hours"]
    left = None if cap is None else cap - spent
    adjusted = verdict_inputs(tests, s["multiplicity"])
    g_base = _per_run_gpu_hours(rep, rep["baseline"]) or 0.0
    bounds = design_bounds(s, alpha_arm) if table is not None else None
    # the looks reconcile took and acted on (control/waves.py) stand over those recomputed here
    recorded = recorded_looks(ledger.looks(exp.id)) if bounds else {}
    arms = {}
    for arm, t in tests.items():
        effect = declared if declared is not None else abs(t.mean)
        dz = (effect / sd) if sd > 0 else (math.inf if effect else 0.0)
        need = pw.seeds_needed(dz, s["power"], alpha_arm)
        robust = pw.seeds_robust(effect, sd, df, s["power"], alpha_arm) if df else need
        per_seed_cost = (_per_run_gpu_hours(rep, arm) or 0.0) + g_base
        add = max(0, need - t.n) if need is not None else None
        half = pw.critical_t(t.n, 0.05) * t.sd / math.sqrt(t.n)
        row: dict[str, Any] = {
            "n": t.n, "mean": t.mean, "ci95": [t.mean - half, t.mean + half], "p": t.p, "p_adjusted": adjusted[arm],
            "per_seed": dict(zip(((rep["paired_vs_baseline"][arm][s["metric"]] or {}).get("per_seed") or {}), t.diffs)),
            "effect": effect, "mde": pw.mde(t.n, s["power"], alpha_arm) * sd if sd > 0 else None,
            "seeds_needed": need, "seeds_needed_robust": robust, "add_seeds": add,
            "add_gpu_hours": add * per_seed_cost if add is not None else None, "predictive_success": None}
        row["look"] = sequential.look(t.diffs, s["waves"], bounds, s["futility"]).as_dict() if bounds else None
        taken = recorded.get(arm)
        if taken is not None:
            row["look"] = {k: v for k, v in taken.items() if k not in ("decision", "reason")}
        if row["look"] is not None:
            row["verdict"], row["reason"] = _wave_verdict(row, experiment, s, per_seed_cost, left)
            if taken is not None:
                row["verdict"], row["reason"] = _recorded_verdict(taken, row["verdict"], row["reason"], experiment)
            arms[arm] = row
            continue
        row["verdict"], row["reason"] = _verdict(row, experiment, s, alpha_arm, left)
        if row["verdict"] == "add":
            row["predictive_success"] = pw.predictive_success(t.diffs, add or 0, alpha_arm)
            row["reason"] += f"; P(they end in a decision) {row['predictive_success']:.2f}; {UNPLANNED}"
        arms[arm] = row
    return {"experiment": experiment, "version": rep["version"], "metric": s["metric"], "baseline": rep["baseline"],
            "alpha": s["alpha"], "alpha_per_arm": alpha_arm, "multiplicity": s["multiplicity"], "power": s["power"],
            "effect": declared, "effect_source": "declared" if declared is not None else "observed",
            "sigma": {"value": sd, "df": df, "source": source}, "max_seeds": s["max_seeds"],
            "spent_gpu_hours": spent, "cap_gpu_hours": cap, "remaining_gpu_hours": left, "arms": arms}


def _verdict(row: dict[str, Any], experiment: str, s: dict[str, Any], alpha_arm: float,
             left: float | None) -> tuple[str, str]:
    decide = f"`ggpo-batch decide {experiment} --not-reproduced --reason TEXT --cost-basis TEXT` records it"
    if row["p_adjusted"] < s["alpha"]:
        return "stop", (f"detected, {_better(row, s)}: p {row['p']:.3g}, {s['multiplicity']}-adjusted "
                        f"{row['p_adjusted']:.3g} < {s['alpha']:g}")
    need, add = row["seeds_needed"], row["add_seeds"]
    if need is None:
        what = "a mean difference of 0" if row["effect"] == 0 else f"a difference of {row['effect']:.4g}"
        return "not_worth_it", f"no number of seeds (up to {pw.MOST_SEEDS:,}) detects {what}; {decide}"
    if add == 0:
        return "stop", (f"{row['n']} seeds had power {s['power']:g} for {row['effect']:.4g} (needed {need}) and did "
                        f"not detect it (adjusted p {row['p_adjusted']:.3g})")
    if need > s["max_seeds"]:
        return "not_worth_it", (f"needs {need} seeds (robust: {row['seeds_needed_robust']}), more than max_seeds "
                                f"{s['max_seeds']}; {decide}")
    if left is not None and row["add_gpu_hours"] > left:
        return "not_worth_it", (f"+{add} seeds cost {row['add_gpu_hours']:.1f} GPU-h > {max(left, 0.0):.1f} left under "
                                f"the cap (robust: {row['seeds_needed_robust']} seeds); {decide}")
    return "add", f"add {add} seeds ({row['add_gpu_hours']:.1f} GPU-h): {need} give power {s['power']:g} at alpha {alpha_arm:.4g}"


def _better(row: dict[str, Any], s: dict[str, Any]) -> str:
    """Whether the arm's difference is an improvement, by the [power] direction of the metric."""
    return "better" if (row["mean"] > 0) == (s["direction"] == "higher") else "worse"


def _wave_verdict(row: dict[str, Any], experiment: str, s: dict[str, Any], per_seed_cost: float,
                  left: float | None) -> tuple[str, str]:
    """A sequential design's verdict: its look decides, and the next wave was planned (no combination test)."""
    lk = row["look"]
    at = (f"look {lk['look']} of {lk['looks']} ({lk['seeds']} seeds)" if lk["look"]
          else f"{row['n']} seeds, before look 1 of {lk['looks']}")
    t = "inf" if lk["t"] is None else f"{abs(lk['t']):.3g}"
    if lk["crossed"]:
        return "stop", f"{at}: |t| {t} >= boundary {lk['boundary']:.3g}: detected, {_better(row, s)}"
    if lk["futile"]:
        return "not_worth_it", (f"{at}: futile, the last wave is unlikely to cross its boundary; `ggpo-batch decide "
                                f"{experiment} --not-reproduced --reason TEXT --cost-basis TEXT` records it")
    if lk["next_wave"] is None:
        return "stop", f"{at}, the last: |t| {t} < boundary {lk['boundary'] or math.inf:.3g}: not detected"
    add = lk["next_wave"] - row["n"]
    cost = add * per_seed_cost
    row.update(add_seeds=add, add_gpu_hours=cost)
    if left is not None and cost > left:
        return "not_worth_it", f"the next wave, +{add} seeds, costs {cost:.1f} GPU-h > {max(left, 0.0):.1f} left under the cap"
    shown = ("" if not lk["look"] else ": cannot stop there" if lk["boundary"] is None
             else f": |t| {t} < boundary {lk['boundary']:.3g}")
    return "add", (f"{at}{shown}; the next wave: +{add} seeds ({cost:.1f} GPU-h) to {lk['next_wave']}, "
                   "as the design planned")


def _recorded_verdict(taken: dict[str, Any], verdict: str, reason: str, experiment: str) -> tuple[str, str]:
    """The verdict of a look reconcile recorded: what it decided, said as advise says it."""
    what = f"look {taken['look']} of {taken['looks']} recorded by reconcile: {taken['decision']}"
    if taken["decision"] == "refused":
        return "not_worth_it", (f"{what}; the next wave was refused by the cost guard and its seeds decided not "
                                f"reproduced (`ggpo-batch report {experiment}` lists the decision)")
    if taken["decision"] == "continue":
        return verdict, f"{reason}; {what}, the next wave released"
    return verdict, f"{reason}; {what}"


def text(advice: dict[str, Any]) -> list[str]:
    """The advice as lines for the terminal."""
    sig = advice["sigma"]
    cap = advice["cap_gpu_hours"]
    lines = [f"{advice['metric']}, arm - {advice['baseline']}, alpha {advice['alpha']:g} two-sided, "
             f"{advice['multiplicity']} over {len(advice['arms'])} arms (planned at {advice['alpha_per_arm']:.4g}); "
             f"spent {advice['spent_gpu_hours']:.2f}" + (f" of {cap:.2f} GPU-h ({advice['remaining_gpu_hours']:.2f} left)"
                                                         if cap is not None else " GPU-h, no cap"),
             f"sigma of the differences {sig['value']:.4g} ({sig['source']}" + (f", {sig['df']} df)" if sig["df"] else ")")
             + ("; effect planned for: " + (f"{advice['effect']:.4g} (declared)" if advice["effect"] is not None
                                            else "each arm's observed difference (winner's curse: optimistic)"))]
    lines.append(f"{'arm':<16} {'diff':>10} {'95 % CI':>22} {'p (adj)':>9} {'MDE':>9} {'seeds':>7}  verdict")
    for arm, r in advice["arms"].items():
        ci = f"[{r['ci95'][0]:.4g}, {r['ci95'][1]:.4g}]"
        mde = f"{r['mde']:.4g}" if r["mde"] is not None else "-"
        seeds = f"{r['seeds_needed']}/{r['seeds_needed_robust']}" if r["seeds_needed"] is not None else "-"
        lines.append(f"{arm:<16} {r['mean']:>10.4g} {ci:>22} {r['p_adjusted']:>9.3f} {mde:>9} {seeds:>7}  "
                     f"{r['verdict']}: {r['reason']}")
    lines.append("seeds: plug-in / robust (sigma at its 80 % upper confidence limit); MDE: the smallest |difference| "
                 f"the seeds run detect with power {advice['power']:g}; intervals assume roughly normal differences "
                 "(each seed's is in --json)")
    return lines
