"""TEMPORARY minimal cost guard (replaced by the full implementation): spec overheads only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .runspec import RunSpec


@dataclass(frozen=True)
class RunEstimate:
    run_key: str
    gpus: int
    loop_seconds: float
    overhead_seconds: float
    gpu_hours: float
    basis: str


@dataclass(frozen=True)
class Estimate:
    runs: tuple[RunEstimate, ...]
    total_gpu_hours: float
    cost_type: str
    cost_basis: str


@dataclass(frozen=True)
class CapCheck:
    ok: bool
    cap_name: str | None
    cap_gpu_hours: float | None
    available_gpu_hours: float | None
    message: str


def estimate(ledger: Any, spec: Any, runs: Sequence[RunSpec]) -> Estimate:
    over = spec.overheads.total_seconds
    rs = tuple(RunEstimate(r.run_key, r.gpus, r.loop_budget_seconds, over, r.gpus * (r.loop_budget_seconds + over) / 3600,
                           "spec overheads") for r in runs)
    return Estimate(rs, sum(r.gpu_hours for r in rs), "estimated from spec", "spec overheads")


def check_caps(ledger: Any, spec: Any, est: Estimate, *, settings: Any, user: str, queue: str) -> CapCheck:
    cap = spec.max_gpu_hours
    if cap is not None and est.total_gpu_hours > cap:
        return CapCheck(False, "experiment", cap, cap, f"estimate {est.total_gpu_hours:.2f} GPU-h > cap {cap:.2f}")
    return CapCheck(True, None, None, None, "within caps")


def record_not_reproduced(ledger: Any, spec: Any, est: Estimate, check: CapCheck, *, actor: str) -> Any:
    return ledger.record_decision(experiment_name=spec.name, kind="not_reproduced_high_cost", actor=actor,
                                  estimated_gpu_hours=est.total_gpu_hours, cap_gpu_hours=check.cap_gpu_hours,
                                  cost_basis=est.cost_basis, cost_type=est.cost_type, automatic_retry=False,
                                  resolution=check.message)


def record_cost_accepted(ledger: Any, spec: Any, est: Estimate, check: CapCheck, *, actor: str, reason: str) -> Any:
    return ledger.record_decision(experiment_name=spec.name, kind="cost_accepted", actor=actor,
                                  estimated_gpu_hours=est.total_gpu_hours, cap_gpu_hours=check.cap_gpu_hours,
                                  reason=reason, automatic_retry=False)
