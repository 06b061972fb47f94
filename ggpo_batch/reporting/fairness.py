"""Comparability of an experiment's arms under an equal budget: the warnings a report prints
above its tables (and lists as `warnings` in JSON), with the thresholds they use, and the notes
that are not unfairness. A report on a fair experiment has no warning."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Comparability thresholds (docs/researcher.md, "Comparability warnings"): beyond these, `warnings` says the arms differ.
LOOP_TIME_TOLERANCE = 0.05  # an arm's mean loop time vs the baseline's, relative
OVERSHOOT_TOLERANCE = 0.05  # an arm's mean overshoot fraction vs the baseline's, absolute (5 points of budget)
BUDGET_TOLERANCE = 1e-9  # loop budgets must be equal (relative)
# Retries, audit failures, missed budget or exposure targets and missing seeds: any one is a warning.


def warning(kind: str, arms: Sequence[str], message: str) -> dict[str, Any]:
    return {"kind": kind, "arms": sorted(arms), "message": message}


def _mean(xs: Sequence[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _seeds(seeds: Iterable[int]) -> str:
    return ", ".join(str(s) for s in sorted(seeds))


def comparability_warnings(by_arm: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str | None, *,
                           requested: str = "clean") -> list[dict[str, Any]]:
    """What makes these arms not comparable under an equal budget, each a {"kind", "arms", "message"}:
    no baseline arm; loop budgets that differ; mean loop time or overshoot beyond LOOP_TIME_TOLERANCE /
    OVERSHOOT_TOLERANCE of the baseline's; runs short of their loop budget or exposure target; runs
    retried (more than one attempt); failed rollout audits; executor / profile / GPU count differing
    from the baseline's; seeds missing from a pair (a run failed, is unfinished, or has no outcome)."""
    out: list[dict[str, Any]] = []
    arms = sorted(by_arm)
    ok = {a: [r for r in by_arm[a] if "steps" in r] for a in arms}
    if baseline is None:
        out.append(warning("no_baseline", [], f"no baseline arm {requested!r} (arms: {', '.join(arms)}): no paired "
                                               f"differences; pass --baseline ARM"))
    ref = baseline if baseline is not None else (arms[0] if arms else None)
    # Loop budgets: the same for every arm, or nothing else is comparable.
    budgets = {a: sorted({r["budget_seconds"] for r in by_arm[a] if r.get("budget_seconds") is not None}) for a in arms}
    ref_budget = (budgets.get(ref) or [None])[0] if ref else None
    for a in arms:
        if len(budgets[a]) > 1:
            out.append(warning("budget_differs", [a], f"{a}: runs have different loop budgets "
                                                       f"({', '.join(f'{b:g}' for b in budgets[a])} s)"))
        elif ref_budget and budgets[a] and abs(budgets[a][0] - ref_budget) > BUDGET_TOLERANCE * ref_budget:
            out.append(warning("budget_differs", [a], f"{a}: loop budget {budgets[a][0]:g} s, {ref} "
                                                       f"{ref_budget:g} s: the arms were not given the same budget"))
    # Loop time reached and overshoot, arm mean vs the reference arm's.
    if ref is not None and ok.get(ref):
        ref_loop = _mean([r["loop_seconds"] for r in ok[ref] if r.get("loop_seconds") is not None])
        ref_over = _mean([r["overshoot_fraction"] for r in ok[ref] if r.get("overshoot_fraction") is not None])
        for a in arms:
            if a == ref or not ok[a]:
                continue
            loop = _mean([r["loop_seconds"] for r in ok[a] if r.get("loop_seconds") is not None])
            over = _mean([r["overshoot_fraction"] for r in ok[a] if r.get("overshoot_fraction") is not None])
            if loop is not None and ref_loop and abs(loop - ref_loop) > LOOP_TIME_TOLERANCE * ref_loop:
                out.append(warning("loop_time_differs", [a], f"{a}: mean loop time {loop:.4g} s vs {ref} "
                                    f"{ref_loop:.4g} s ({(loop / ref_loop - 1) * 100:+.1f} %, tolerance "
                                    f"{LOOP_TIME_TOLERANCE * 100:g} %)"))
            if over is not None and ref_over is not None and abs(over - ref_over) > OVERSHOOT_TOLERANCE:
                out.append(warning("overshoot_differs", [a], f"{a}: mean overshoot {over * 100:.1f} % of the budget "
                                    f"vs {ref} {ref_over * 100:.1f} % (tolerance {OVERSHOOT_TOLERANCE * 100:g} "
                                    f"points)"))
    for a in arms:
        short = [r for r in ok[a] if r.get("time_budget_reached") is False]
        if short:
            out.append(warning("budget_not_reached", [a], f"{a}: {len(short)} run(s) stopped before the loop budget "
                                                           f"(seeds {_seeds(r['seed'] for r in short)})"))
        missed = [r for r in ok[a] if r.get("exposure_target_reached") is False]
        if missed:
            out.append(warning("exposure_target_not_reached", [a],
                                f"{a}: {len(missed)} run(s) short of the exposure target (seeds "
                                f"{_seeds(r['seed'] for r in missed)}): not matched"))
        retried = [r for r in by_arm[a] if r["attempts"] > 1]
        if retried:
            what = "; ".join(f"seed {r['seed']}: {r['attempts']} attempts ({', '.join(r['attempt_states'])})"
                             for r in retried)
            out.append(warning("retried", [a], f"{a}: {len(retried)} run(s) retried ({what}); other runs took "
                                                f"one attempt"))
        bad = [r for r in by_arm[a] if r["audit_failed"]]
        if bad:
            out.append(warning("audit_failed", [a], f"{a}: rollout audit failed for seeds "
                                                     f"{_seeds(r['seed'] for r in bad)}: left out of every statistic"))
    # Resources: executor, profile, GPUs per run (the GPU model is not in the ledger).
    res = {a: sorted({r["resources"] for r in by_arm[a]}, key=str) for a in arms}
    if ref is not None:
        def fmt(rs: Sequence[tuple[str, str, int | None]]) -> str:
            return "; ".join(f"{e}/{p}/{g} GPUs" for e, p, g in rs)

        for a in arms:
            if a != ref and res[a] != res[ref]:
                out.append(warning("resources_differ", [a], f"{a} ran on {fmt(res[a])}, {ref} on {fmt(res[ref])} "
                                                             f"(executor/profile/GPUs)"))
    # Seeds: every arm should have a comparable run (with an outcome) for the baseline's seeds.
    if baseline is not None:
        all_seeds = {r["seed"] for a in arms for r in by_arm[a]}
        for a in arms:
            have = {r["seed"] for r in ok[a]}
            missing = all_seeds - have
            if missing:
                why = {r["seed"]: (r["state"] if r["state"] != "succeeded" else "audit failed" if r["audit_failed"]
                                   else "no result") for r in by_arm[a] if r["seed"] in missing}
                detail = ", ".join(f"{s} ({why.get(s, 'no run')})" for s in sorted(missing))
                out.append(warning("seeds_missing", [a], f"{a}: no comparable run for seed(s) {detail}: "
                                                          f"{'every pair with it' if a == baseline else 'its pair with ' + baseline} "
                                                          f"is missing"))
        base_out = {r["seed"] for r in ok[baseline] if r.get("outcome")}
        for a in arms:
            if a == baseline:
                continue
            mine = {r["seed"] for r in ok[a] if r.get("outcome")}
            if (mine or base_out) and mine != base_out:
                lost = (mine ^ base_out) & {r["seed"] for r in ok[a]} & {r["seed"] for r in ok[baseline]}
                if lost:
                    out.append(warning("seeds_missing", [a, baseline], f"{a} vs {baseline}: no outcome to pair "
                                                                       f"for seed(s) {_seeds(lost)}"))
    return out


def notes(by_arm: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """What the reader should know that is not unfairness: runs without an evaluation outcome."""
    ok = [r for rows in by_arm.values() for r in rows if "steps" in r]
    none = [r for r in ok if not r.get("outcome")]
    notes = []
    if none:
        notes.append(f"{len(none)} of {len(ok)} comparable runs have no evaluation outcome in the ledger (imported "
                     f"runs, or jobs that wrote no evaluation): outcome statistics count only runs that have one")
    return notes
