"""The run result record: the schema of one entry of seeds/000 (keyed "<seed>/<arm>") and its invariants.

The training job writes it, `ledger import` reads it, and both check it here, so the contract
lives in one place. Units: seconds, GPU-hours, token counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import RecordError
from .accounting import gpu_hours

# The stamps, and the one status each becomes when the check behind it fails (docs/how-it-works.md, the stamps).
# training.status: the independent rollout audit (ggpo_batch/train/audit/audit.py) found no problem / found some.
TRAINING_STATUS_VALIDATED = "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED"
TRAINING_STATUS_AUDIT_FAILED = "ROLLOUT_AUDIT_FAILED"
# budget.status: reconciled only when the loop reached its time budget AND the arm its exposure target
# (then, and only then, arms may be compared as matched); otherwise short of one or both.
BUDGET_STATUS_RECONCILED = "BUDGET_AND_EXPOSURE_RECONCILED"
BUDGET_STATUS_SHORT = "BUDGET_OR_EXPOSURE_TARGET_NOT_REACHED"


def audit_failed(rec: Mapping[str, Any] | None) -> bool:
    """Does a run record carry a training status other than the validated stamp (audit failed)?"""
    status = (rec or {}).get("training", {}).get("status")
    return status is not None and status != TRAINING_STATUS_VALIDATED


def budget_reconciled(rec: Mapping[str, Any] | None) -> bool:
    """Does a run record carry the reconciled budget stamp (its arms may be compared as matched)?"""
    return bool(rec) and rec.get("budget", {}).get("status") == BUDGET_STATUS_RECONCILED

RUN_KEYS = ("arm", "seed", "training", "budget", "timing")
TRAINING_KEYS = ("status", "counts", "cost", "auxiliary_sources", "cost_limitations")
COUNT_KEYS = (
    "nonzero_advantage_tokens",
    "trajectories",
    "shared_trajectories",
    "actual_exposed",
    "exposed_with_nonzero_advantage",
    "retrieved_trajectories",
    "shared_groups",
    "steps",
)
COST_KEYS = (
    "rl_sequence_nonpadding_tokens",
    "rl_sequence_padded_tokens",
    "rl_loss_tokens",
    "backend_generated_tokens",
    "backend_requested_input_tokens",
    "backend_calls",
)
# Present only for arms with the auxiliary supervised answer loss.
AUX_COST_KEYS = (
    "aux_sequence_nonpadding_tokens_including_dp_padding",
    "aux_sequence_padded_tokens",
    "aux_loss_tokens",
)
# The per-seed figures of a run record the report differences against the baseline arm (beside the
# outcome metrics, contracts/outcome.py), and so the record metrics a [power] table may plan for.
PAIRED_RECORD_METRICS = ("steps", "allocated_gpu_hours", "overshoot_fraction", "loop_seconds", "elapsed_seconds")
TOKEN_METRICS = ("nonzero_advantage_tokens", *COST_KEYS, *AUX_COST_KEYS)
AUX_SOURCE_KEYS = (
    "groups_considered",
    "skipped_no_verified_target",
    "gold_checked_clean_answer",
    "examples",
    "answer_tokens",
    "training_gold_with_support_title_coverage",
)
BUDGET_KEYS = (
    "status",
    "effective_steps",
    "loop_seconds",
    "budget_seconds",
    "overshoot_seconds",
    "overshoot_fraction",
    "last_batch_seconds",
    "actual_exposed",
    "target_exposed",
    "exposure_templates",
    "time_budget_reached",
    "exposure_target_reached",
    "matched_interpretation_allowed",
    "limitation",
)
TIMING_KEYS = (
    "arm",
    "gpus",
    "training_seconds_including_setup_and_export",
    "audit_seconds",
    "evaluation_seconds",
    "elapsed_seconds",
    "allocated_gpu_hours_through_evaluation",
    "training_allocated_gpu_hours",
)

COST_LIMITATIONS = (
    "Input tokens count actual backend requests, not cache-adjusted FLOPs. RL sequence tokens are "
    "one tensor pass proxy; policy/reference/rollout-logprob and backward differ in cost. Auxiliary "
    "includes zero-loss DP padding. Equal optimizer steps are not equal total computation."
)
BUDGET_LIMITATION = (
    "Endpoint is first completed batch at the shared loop-time budget. Includes RL and auxiliary "
    "supervision; excludes initialization/export/evaluation/post-update sync. Actual token costs, GPU "
    "allocation time and overshoot remain separately reported. This is not exact FLOP matching."
)

# Float invariants are recomputed from the record's own fields; the seeds satisfy them to ~1e-15.
_REL_TOL = 1e-9
_ABS_TOL = 1e-9


def entry_key(seed: int, arm: str) -> str:
    """The key of a run in a results file: "<seed>/<arm>"."""
    return f"{seed}/{arm}"


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)


def _missing(block: Mapping[str, Any], keys: tuple[str, ...], where: str) -> list[str]:
    return [f"{where}.{k} is missing" for k in keys if k not in block]


def _numbers(block: Mapping[str, Any], keys: tuple[str, ...], where: str, integral: bool) -> list[str]:
    problems = []
    for k in keys:
        if k not in block:
            continue
        v = block[k]
        ok = isinstance(v, int) if integral else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok:
            kind = "an integer" if integral else "a number"
            problems.append(f"{where}.{k} must be {kind}, got {v!r}")
        elif v < 0 or (isinstance(v, float) and not math.isfinite(v)):
            problems.append(f"{where}.{k} must be finite and >= 0, got {v!r}")
    return problems


def check_run_record(key: str, rec: Any) -> list[str]:
    """Every way `rec` breaks the seed-000 schema or its invariants, as readable lines (empty if none)."""
    if not isinstance(rec, Mapping):
        return [f"{key}: must be an object, got {type(rec).__name__}"]
    p = _missing(rec, RUN_KEYS, key)
    if p:
        return p
    arm, seed = rec["arm"], rec["seed"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        p.append(f"{key}.seed must be an integer, got {seed!r}")
    if not isinstance(arm, str) or not arm:
        p.append(f"{key}.arm must be a non-empty string, got {arm!r}")
    if not p and key != entry_key(seed, arm):
        p.append(f"{key}: key does not match seed/arm ({entry_key(seed, arm)})")
    blocks = {b: rec[b] for b in ("training", "budget", "timing")}
    for name, block in blocks.items():
        if not isinstance(block, Mapping):
            p.append(f"{key}.{name} must be an object")
    if p:
        return p
    tr, bu, ti = blocks["training"], blocks["budget"], blocks["timing"]
    p += _missing(tr, TRAINING_KEYS, f"{key}.training")
    p += _missing(bu, BUDGET_KEYS, f"{key}.budget")
    p += _missing(ti, TIMING_KEYS, f"{key}.timing")
    if p:
        return p
    counts, cost, aux = tr["counts"], tr["cost"], tr["auxiliary_sources"]
    if not all(isinstance(b, Mapping) for b in (counts, cost, aux)):
        return [f"{key}.training.counts, .cost and .auxiliary_sources must be objects"]
    p += _missing(counts, COUNT_KEYS, f"{key}.training.counts")
    p += _missing(cost, COST_KEYS, f"{key}.training.cost")
    p += _numbers(counts, COUNT_KEYS, f"{key}.training.counts", integral=True)
    p += _numbers(cost, COST_KEYS + AUX_COST_KEYS, f"{key}.training.cost", integral=True)
    if aux:
        p += _missing(aux, AUX_SOURCE_KEYS, f"{key}.training.auxiliary_sources")
        p += _missing(cost, AUX_COST_KEYS, f"{key}.training.cost")
        p += _numbers(aux, AUX_SOURCE_KEYS, f"{key}.training.auxiliary_sources", integral=True)
    # overshoot_seconds may be negative only on a broken record; it is checked as an invariant below.
    p += _numbers(bu, ("loop_seconds", "budget_seconds", "last_batch_seconds"), f"{key}.budget", integral=False)
    p += _numbers(bu, ("effective_steps", "actual_exposed", "target_exposed"), f"{key}.budget", integral=True)
    timing_floats = tuple(k for k in TIMING_KEYS if k not in ("arm", "gpus"))
    p += _numbers(ti, timing_floats, f"{key}.timing", integral=False)
    p += _numbers(ti, ("gpus",), f"{key}.timing", integral=True)
    if p:
        return p

    # Invariants of the accounting rules (DESIGN.md, Accounting).
    if ti["arm"] != arm:
        p.append(f"{key}.timing.arm is {ti['arm']!r}, the run's arm is {arm!r}")
    if bu["effective_steps"] != counts["steps"]:
        p.append(f"{key}: budget.effective_steps {bu['effective_steps']} != training.counts.steps {counts['steps']}")
    if bu["actual_exposed"] != counts["actual_exposed"]:
        p.append(f"{key}: budget.actual_exposed != training.counts.actual_exposed")
    if bu["budget_seconds"] <= 0:
        p.append(f"{key}.budget.budget_seconds must be > 0")
        return p
    over = bu["loop_seconds"] - bu["budget_seconds"]
    if not isinstance(bu["overshoot_seconds"], (int, float)) or not _close(bu["overshoot_seconds"], over):
        p.append(f"{key}.budget.overshoot_seconds {bu['overshoot_seconds']!r} != loop - budget = {over!r}")
    elif not _close(bu["overshoot_fraction"], over / bu["budget_seconds"]):
        p.append(f"{key}.budget.overshoot_fraction {bu['overshoot_fraction']!r} != overshoot / budget")
    if bu["time_budget_reached"] is not (bu["loop_seconds"] >= bu["budget_seconds"]):
        p.append(f"{key}.budget.time_budget_reached disagrees with loop_seconds >= budget_seconds")
    if bu["exposure_target_reached"] is not (bu["actual_exposed"] >= bu["target_exposed"]):
        p.append(f"{key}.budget.exposure_target_reached disagrees with actual_exposed >= target_exposed")
    matched = bu["time_budget_reached"] is True and bu["exposure_target_reached"] is True
    if bu["matched_interpretation_allowed"] is not matched:
        p.append(f"{key}.budget.matched_interpretation_allowed must be time_budget_reached and exposure_target_reached")
    if bu["status"] == BUDGET_STATUS_RECONCILED and not matched:
        p.append(f"{key}.budget.status is {BUDGET_STATUS_RECONCILED} although the time budget or the exposure "
                 f"target was not reached")
    templates = bu["exposure_templates"]
    if not isinstance(templates, Mapping) or sum(templates.values()) != bu["actual_exposed"]:
        p.append(f"{key}.budget.exposure_templates must sum to actual_exposed {bu['actual_exposed']}")
    gpus = ti["gpus"]
    want = gpu_hours(gpus, ti["elapsed_seconds"])
    if not _close(ti["allocated_gpu_hours_through_evaluation"], want):
        p.append(
            f"{key}.timing.allocated_gpu_hours_through_evaluation {ti['allocated_gpu_hours_through_evaluation']!r}"
            f" != gpus x elapsed_seconds / 3600 = {want!r}"
        )
    want = gpu_hours(gpus, ti["training_seconds_including_setup_and_export"])
    if not _close(ti["training_allocated_gpu_hours"], want):
        p.append(
            f"{key}.timing.training_allocated_gpu_hours {ti['training_allocated_gpu_hours']!r}"
            f" != gpus x training_seconds_including_setup_and_export / 3600 = {want!r}"
        )
    parts = ti["training_seconds_including_setup_and_export"] + ti["audit_seconds"] + ti["evaluation_seconds"]
    # Elapsed runs from allocation start to end; the phases inside it cannot add up to more.
    if parts > ti["elapsed_seconds"] * (1 + 1e-6) + 1e-6:
        p.append(f"{key}.timing: training + audit + evaluation ({parts!r} s) exceed elapsed_seconds")
    if bu["loop_seconds"] > ti["training_seconds_including_setup_and_export"] + 1e-6:
        p.append(f"{key}: budget.loop_seconds exceeds timing.training_seconds_including_setup_and_export")
    return p


def check_results_file(data: Any) -> list[str]:
    """All problems of a whole results file (an object keyed "<seed>/<arm>")."""
    if not isinstance(data, Mapping) or not data:
        return ["the file must be a non-empty JSON object keyed \"<seed>/<arm>\""]
    problems: list[str] = []
    for key, rec in data.items():
        problems += check_run_record(str(key), rec)
    return problems


def require_valid(key: str, rec: Any) -> None:
    """Raise RecordError naming every problem of one run record."""
    problems = check_run_record(key, rec)
    if problems:
        raise RecordError("; ".join(problems))
