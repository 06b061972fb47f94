"""A run's evaluation outcome: the figures the ledger keeps per run (`runs.outcome`) and the report
compares across arms, reduced from the evaluation the training job writes into its details file.

The job (`train/evaluation.py`) writes, under the details file's key `evaluation`, one row per
evaluated held-out item: `item_id`, `exposed` (the run trained on it before its budget ended, on any
rank), `reward` (the mean over the item's samples) and the answers. Settlement reads that file when
an attempt succeeds and books `outcome_from_evaluation(...)` with the run's result, in one
transaction. Imported runs and runs from jobs older than this contract have no outcome (None).

The outcome, plain JSON:

| key | meaning |
| --- | --- |
| `eval_reward` | mean reward over every evaluated item |
| `exposed_reward` | mean over the items the run actually trained on (None where it trained on none) |
| `unexposed_reward` | mean over the others (None where there are none) |
| `items`, `exposed_items` | how many items each figure rests on |
| `decoding`, `temperature`, `samples` | greedy, or `samples` sampled answers per item at `temperature` |
| `item_rewards` | `{item_id: reward}`: lets the report compare an arm's exposed items with the baseline run's reward on the same items |
| `exposed_item_ids` | the items counted as exposed |

Imports nothing heavy: settlement (the control plane) and the report use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

OUTCOME_VERSION = 1
# The outcome metrics the report summarises and differences, in this order.
OUTCOME_METRICS = ("eval_reward", "exposed_reward", "unexposed_reward")
METRIC_LABELS = {
    "eval_reward": "reward, all held-out items",
    "exposed_reward": "reward, items trained on (exposed)",
    "unexposed_reward": "reward, items not trained on",
}
GREEDY = "greedy"
SAMPLED = "sampled"


def _mean(xs: list[float]) -> float | None:
    return math.fsum(xs) / len(xs) if xs else None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def outcome_from_evaluation(ev: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ledger's outcome figures of one run's evaluation (module docstring); None when `ev` has
    no usable figures. Evaluations written before per-item rows existed give the split means only."""
    if not isinstance(ev, Mapping):
        return None
    rows = ev.get("per_item")
    if isinstance(rows, list) and rows:
        rewards: dict[str, float] = {}
        exposed: list[str] = []
        for row in rows:
            if not isinstance(row, Mapping) or not isinstance(row.get("item_id"), str):
                return None
            r = _number(row.get("reward"))
            if r is None:
                return None
            rewards[row["item_id"]] = r
            if row.get("exposed"):
                exposed.append(row["item_id"])
        ex = set(exposed)
        return {
            "version": OUTCOME_VERSION,
            "eval_reward": _mean(list(rewards.values())),
            "exposed_reward": _mean([r for i, r in rewards.items() if i in ex]),
            "unexposed_reward": _mean([r for i, r in rewards.items() if i not in ex]),
            "items": len(rewards), "exposed_items": len(ex),
            "decoding": ev.get("decoding"), "temperature": _number(ev.get("temperature")),
            "samples": ev.get("samples") if isinstance(ev.get("samples"), int) else None,
            "item_rewards": rewards, "exposed_item_ids": sorted(ex),
        }
    # The evaluation before this contract: split means and counts only.
    n, k = ev.get("items"), ev.get("exposed_items")
    if not isinstance(n, int) or not isinstance(k, int) or n <= 0:
        return None
    er, ur = _number(ev.get("exposed_mean_reward")), _number(ev.get("unexposed_mean_reward"))
    parts = [(er, k), (ur, n - k)]
    total = math.fsum(m * c for m, c in parts if m is not None and c)
    known = sum(c for m, c in parts if m is not None and c)
    return {"version": OUTCOME_VERSION, "eval_reward": total / known if known == n else None,
            "exposed_reward": er, "unexposed_reward": ur, "items": n, "exposed_items": k,
            "decoding": SAMPLED, "temperature": None, "samples": 1, "item_rewards": None,
            "exposed_item_ids": None}


def read_outcome(details: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(outcome, None) from a details file; (None, why) when it is absent, unreadable or has no
    evaluation. Never raises: a run without an outcome is still a run."""
    try:
        data = json.loads(Path(details).read_text())
    except FileNotFoundError:
        return None, f"{details}: no details file"
    except (OSError, ValueError) as exc:
        return None, f"{details}: unreadable ({exc})"
    out = outcome_from_evaluation(data.get("evaluation") if isinstance(data, Mapping) else None)
    return (out, None) if out is not None else (None, f"{details}: no usable evaluation")


def metric_items(outcome: Mapping[str, Any], metric: str) -> list[str] | None:
    """The item ids `metric` of this outcome averages over (None without per-item rewards)."""
    rewards = outcome.get("item_rewards")
    if not isinstance(rewards, Mapping):
        return None
    exposed = set(outcome.get("exposed_item_ids") or ())
    if metric == "exposed_reward":
        return sorted(i for i in rewards if i in exposed)
    if metric == "unexposed_reward":
        return sorted(i for i in rewards if i not in exposed)
    return sorted(rewards)


def mean_over(outcome: Mapping[str, Any], items: Iterable[str]) -> float | None:
    """Mean reward of this outcome over `items` (those it evaluated); None when none or no rows."""
    rewards = outcome.get("item_rewards")
    if not isinstance(rewards, Mapping):
        return None
    return _mean([float(rewards[i]) for i in items if i in rewards])


def matched_difference(arm: Mapping[str, Any], base: Mapping[str, Any], metric: str) -> tuple[float | None, bool]:
    """arm - baseline for `metric`, both averaged over the same items: the items `metric` covers in
    the arm's run (e.g. the items it trained on) that the baseline run also evaluated. Without
    per-item rewards, the two runs' own figures (second value False: items not matched)."""
    ids = metric_items(arm, metric)
    if ids is not None and isinstance(base.get("item_rewards"), Mapping):
        common = [i for i in ids if i in base["item_rewards"]]
        a, b = mean_over(arm, common), mean_over(base, common)
        return (a - b if a is not None and b is not None else None), True
    a, b = _number(arm.get(metric)), _number(base.get(metric))
    return (a - b if a is not None and b is not None else None), False
