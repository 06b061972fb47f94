"""The run record (one entry of the seeds/000 schema), built from what the run actually did."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...contracts.run_record import (
    BUDGET_LIMITATION,
    BUDGET_STATUS_RECONCILED,
    BUDGET_STATUS_SHORT,
    COST_LIMITATIONS,
    TRAINING_STATUS_AUDIT_FAILED,
    TRAINING_STATUS_VALIDATED,
    gpu_hours,
)
from ...contracts.runspec import ArmSpec
from .trainer import AUX, COSTS, COUNTS


def build_record(*, arm: ArmSpec, seed: int, totals: Mapping[str, int], templates: Mapping[str, int], steps: int,
                 audit_ok: bool, loop_seconds: float, budget_seconds: float, last_batch_seconds: float, gpus: int,
                 training_seconds: float, audit_seconds: float, evaluation_seconds: float,
                 elapsed_seconds: float) -> dict[str, Any]:
    """`totals` are the rank-summed counters of the trainer (COUNTS + COSTS + AUX keys)."""
    counts = {k: int(totals[k]) for k in COUNTS}
    counts["steps"] = steps
    aux_arm = arm.auxiliary_answer_loss
    cost_keys = COSTS if aux_arm else COSTS[:6]
    cost = {k: int(totals[k]) for k in cost_keys}
    aux = {k: int(totals[k]) for k in AUX} if aux_arm else {}
    actual, target = counts["actual_exposed"], arm.target_exposed
    time_reached = loop_seconds >= budget_seconds
    exposure_reached = actual >= target
    # Arms compare as matched only if each stopped by the shared budget with its full exposure; the
    # stamp says so only then (the template split must also account for every exposure).
    matched = time_reached and exposure_reached
    reconciled = matched and sum(templates.values()) == actual
    over = loop_seconds - budget_seconds
    return {
        "arm": arm.name,
        "seed": seed,
        "training": {
            "status": TRAINING_STATUS_VALIDATED if audit_ok else TRAINING_STATUS_AUDIT_FAILED,
            "counts": counts,
            "cost": cost,
            "auxiliary_sources": aux,
            "cost_limitations": COST_LIMITATIONS,
        },
        "budget": {
            "status": BUDGET_STATUS_RECONCILED if reconciled else BUDGET_STATUS_SHORT,
            "effective_steps": steps,
            "loop_seconds": loop_seconds,
            "budget_seconds": float(budget_seconds),
            "overshoot_seconds": over,
            "overshoot_fraction": over / budget_seconds,
            "last_batch_seconds": last_batch_seconds,
            "actual_exposed": actual,
            "target_exposed": target,
            "exposure_templates": dict(templates),
            "time_budget_reached": time_reached,
            "exposure_target_reached": exposure_reached,
            "matched_interpretation_allowed": matched,
            "limitation": BUDGET_LIMITATION,
        },
        "timing": {
            "arm": arm.name,
            "gpus": gpus,
            "training_seconds_including_setup_and_export": training_seconds,
            "audit_seconds": audit_seconds,
            "evaluation_seconds": evaluation_seconds,
            "elapsed_seconds": elapsed_seconds,
            "allocated_gpu_hours_through_evaluation": gpu_hours(gpus, elapsed_seconds),
            "training_allocated_gpu_hours": gpu_hours(gpus, training_seconds),
        },
    }
