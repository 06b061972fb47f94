"""`ggpo-batch status --components`: the last nights of each method, the metrics that moved by
more than a threshold since the previous night, and the scheduled nights with no run at all.

Pure data (dicts) from the ledger's component-run rows, so the CLI prints a table or JSON of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from .component_record import FACT_CHECKS
from .schedule import missed_nights

# The metrics a night-to-night comparison looks at (means over seeds).
WATCHED = ("parameter_delta_l2", "baseline_validation_nll", "final_validation_nll", "final_test_nll",
           "generated_tokens", "natural_eos_rollouts", "rejected_diagnostic_groups",
           "frozen_teacher_parameter_delta_l2")


def _mean(record: Mapping[str, Any] | None, key: str) -> float | None:
    try:
        return float(record["metrics"][key]["mean"])  # type: ignore[index]
    except (TypeError, KeyError):
        return None


def moved_metrics(current: Mapping[str, Any], previous: Mapping[str, Any], threshold: float) -> list[dict[str, Any]]:
    """Metrics whose mean changed by more than `threshold` relative to the previous night's; from a
    previous mean of exactly 0 any change counts (relative_change None), so a frozen delta leaving 0 shows."""
    moved = []
    for key in WATCHED:
        a, b = _mean(previous, key), _mean(current, key)
        if a is None or b is None:
            continue
        change = abs(b - a) / abs(a) if a != 0 else None
        if (change is not None and change > threshold) or (change is None and b != 0):
            moved.append({"metric": key, "previous": a, "current": b, "relative_change": change})
    return moved


def _failed_checks(record: Mapping[str, Any] | None) -> list[str]:
    checks = (record or {}).get("execution_checks") or {}
    return sorted(k for k, v in checks.items() if v is False and k not in FACT_CHECKS)


def component_status(ledger: Any, *, cron: str, nights: int = 14, threshold: float = 0.1,
                     now: datetime | None = None, methods: Sequence[str] | None = None) -> dict[str, Any]:
    """Rows (newest first) for the last `nights` nights, with moved metrics and missed nights per method."""
    now = now or datetime.now(UTC)
    start = datetime.combine(now.date() - timedelta(days=nights), time.max, tzinfo=UTC)
    runs = ledger.component_runs(limit=max(50, nights * 10))
    by_method: dict[str, list[Any]] = {}
    for r in runs:
        by_method.setdefault(r.method, []).append(r)
    out_methods = []
    for method in sorted(set(by_method) | set(methods or ())):
        mruns = sorted(by_method.get(method, []), key=lambda r: (r.night, r.id))
        rows = []
        last_ok: Any = None
        for r in mruns:
            row = {
                "night": r.night, "method": r.method, "tier": r.tier, "state": r.state, "seconds": r.seconds,
                "commit": r.commit, "dirty": r.dirty, "actor": r.actor, "error": r.error,
                "final_test_nll": _mean(r.record, "final_test_nll"),
                "parameter_delta_l2": _mean(r.record, "parameter_delta_l2"),
                "failed_checks": _failed_checks(r.record),
                "moved": [], "compared_with": None,
            }
            if r.state == "succeeded" and r.record:
                if last_ok is not None:
                    row["moved"] = moved_metrics(r.record, last_ok.record, threshold)
                    row["compared_with"] = last_ok.night
                last_ok = r
            rows.append(row)
        recent = [row for row in rows if row["night"] > start.date().isoformat()]
        ran = {date.fromisoformat(r.night) for r in mruns}
        # Nights before the method's first recorded night predate its schedule: not missed. A method
        # that never ran at all shows the whole window as missed, so that is never silent either.
        first = min(ran) if ran else None
        since = max(start, datetime.combine(first, time.min, tzinfo=UTC)) if first else start
        out_methods.append({
            "method": method,
            "nights": list(reversed(recent)),
            "missed_nights": [d.isoformat() for d in missed_nights(cron, ran, since, now)],
        })
    return {"threshold": threshold, "cron": cron, "since": start.date().isoformat(), "methods": out_methods}
