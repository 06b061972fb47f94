"""Two experiment reports (two experiments, or two versions of one) side by side: `report A B`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..contracts.arm_train import changes_text
from ..contracts.outcome import OUTCOME_METRICS
from . import stats
from .fairness import warning

COMPARED_METRICS = (*OUTCOME_METRICS, "steps", "loop_seconds", "allocated_gpu_hours")


def _label(rep: Mapping[str, Any]) -> str:
    return f"{rep['experiment']} v{rep['version']}" if rep.get("version") is not None else str(rep["experiment"])


def _per_seed_values(rep: Mapping[str, Any], arm: str, metric: str) -> list[float]:
    seeds = rep["arms"].get(arm, {}).get("per_seed", {})
    return [v[metric] for v in seeds.values() if v.get(metric) is not None]


def _dict_diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [f"{k}: {a.get(k, '(default)')!r} -> {b.get(k, '(default)')!r}" for k in keys if a.get(k) != b.get(k)]


def compare_reports(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two experiment reports (two experiments, or two versions of one) side by side: per arm and
    metric each side's summary and B - A with Welch's t interval (the runs of two experiments are
    independent: not paired, even where the seeds are the same numbers); each side's arm - baseline
    differences; and `warnings`: what differs between the two setups, then each side's own."""
    la, lb = _label(a), _label(b)
    if la == lb:
        la, lb = f"A: {la}", f"B: {lb}"
    base = a.get("baseline") or b.get("baseline")
    arms = sorted(set(a["arms"]) | set(b["arms"]), key=lambda x: (x != base, x))
    out_arms: dict[str, Any] = {}
    for arm in arms:
        row: dict[str, Any] = {"in": [side for side, rep in (("a", a), ("b", b)) if arm in rep["arms"]]}
        for m in COMPARED_METRICS:
            va, vb = _per_seed_values(a, arm, m), _per_seed_values(b, arm, m)
            row[m] = {"a": stats.summary(va), "b": stats.summary(vb), "b_minus_a": stats.welch(va, vb)}
        out_arms[arm] = row
    paired: dict[str, Any] = {}
    for arm in sorted(set(a["paired_vs_baseline"]) | set(b["paired_vs_baseline"])):
        pa, pb = a["paired_vs_baseline"].get(arm, {}), b["paired_vs_baseline"].get(arm, {})
        row = {}
        for m in (*OUTCOME_METRICS, "steps", "allocated_gpu_hours"):
            da, db = pa.get(m), pb.get(m)
            if da is None and db is None:
                continue
            row[m] = {"a": {k: v for k, v in (da or {}).items() if k != "per_seed"} or None,
                      "b": {k: v for k, v in (db or {}).items() if k != "per_seed"} or None,
                      "b_minus_a": stats.welch((da or {}).get("per_seed", {}).values(),
                                               (db or {}).get("per_seed", {}).values())}
        paired[arm] = row
    warnings: list[dict[str, Any]] = []
    for key, what in (("method", "method"), ("gpus", "GPUs per run"), ("baseline", "baseline arm")):
        if a.get(key) != b.get(key):
            warnings.append(warning(f"{key}_differs", [], f"{what}: {la} {a.get(key)!r}, {lb} {b.get(key)!r}"))
    budgets = {side: sorted({x["budget_seconds"]["mean"] for x in rep["arms"].values()
                             if x.get("budget_seconds", {}).get("mean") is not None})
               for side, rep in (("a", a), ("b", b))}
    if budgets["a"] and budgets["b"] and budgets["a"] != budgets["b"]:
        warnings.append(warning("budget_differs", [], f"loop budget: {la} {budgets['a']} s, {lb} {budgets['b']} s"))
    if a.get("train") is not None and b.get("train") is not None and a["train"] != b["train"]:
        warnings.append(warning("train_config_differs", [], "[train] differs: " + "; ".join(_dict_diff(a["train"],
                                                                                                         b["train"]))))
    only = {side: [x for x in arms if x not in rep["arms"]] for side, rep in (("a", b), ("b", a))}
    for side, missing in only.items():
        if missing:
            warnings.append(warning("arms_differ", missing, f"only in {la if side == 'a' else lb}: "
                                                             f"{', '.join(missing)}"))
    dec_a = sorted({d for x in a["arms"].values() for d in x.get("decoding", [])})
    dec_b = sorted({d for x in b["arms"].values() for d in x.get("decoding", [])})
    if dec_a and dec_b and dec_a != dec_b:
        warnings.append(warning("decoding_differs", [], f"evaluation decoding: {la} {dec_a}, {lb} {dec_b}"))
    for lab, rep in ((la, a), (lb, b)):
        warnings += [{**w, "message": f"{lab}: {w['message']}", "side": lab} for w in rep.get("warnings", [])]
    changes = {arm: {"a": (a.get("changes") or {}).get(arm, {}), "b": (b.get("changes") or {}).get(arm, {})}
               for arm in arms}
    differ = [arm for arm, row in changes.items() if arm in a["arms"] and arm in b["arms"] and row["a"] != row["b"]]
    if differ:
        warnings.insert(0, warning("arm_changes_differ", differ, "arms that change other fields against the "
                                   "baseline in A and in B: " + "; ".join(
                                       f"{arm}: {changes_text(changes[arm]['a'])} | {changes_text(changes[arm]['b'])}"
                                       for arm in differ)))
    return {"compare": [la, lb], "baseline": base, "arms": out_arms, "paired_vs_baseline": paired,
            "changes": changes, "warnings": warnings, "a": a, "b": b}
