"""The component-run record (schema 2, seeds/003): its keys, the mean/std/n aggregation over
seeds, and `check_component_record`, which both the writer and the ledger import use."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

SCHEMA_VERSION = 2

RECORD_KEYS = (
    "schema_version", "method", "manifest_ref", "adapter", "evaluation_tier", "measured_locally", "seeds",
    "diagnostic_only", "promotion_eligible", "evolve_integrated", "dataset", "evaluation_protocol", "metrics",
    "per_seed", "execution_checks", "provenance", "full_experiment_status", "full_experiment",
)
# Not in seed 003; the issue asks for the tier's time in the record.
OPTIONAL_RECORD_KEYS = ("timing",)
DATASET_KEYS = ("id", "revision", "source_url", "source_sha256", "byte_ranges")
SPLITS = ("train", "validation", "test")
PROTOCOL_KEYS = (
    "tier", "formal_comparison", "seeds", "selection", "claim_policy", "model", "separate_train_validation_test",
    "teacher_steps", "specialist_steps", "student_steps", "max_new_tokens", "sif", "tf_opd", "waypoint", "cce",
    "waypoint_teacher_rl",
)
METRIC_KEYS = (
    "parameter_delta_l2", "baseline_validation_nll", "final_validation_nll", "final_test_nll", "generated_tokens",
    "natural_eos_rollouts", "rejected_diagnostic_groups", "frozen_teacher_parameter_delta_l2",
)
INTEGER_METRICS = ("generated_tokens", "natural_eos_rollouts", "rejected_diagnostic_groups")
PER_SEED_KEYS = (
    "seed", "parameter_delta_l2", "baseline_validation_nll", "final_validation_nll", "final_test_nll",
    "generated_tokens", "natural_eos_rollouts", "rejected_diagnostic_groups", "history", "reference_refreshes",
    "behavior_syncs", "behavior_is_reference", "reward", "frozen_teacher_parameter_deltas_l2",
    "frozen_rl_snapshot_parameter_deltas_l2",
)
HISTORY_KEYS = (
    "step", "loss", "gradient_norm", "retained_groups", "raw_gap", "mean_length", "branch", "reference_refreshed",
)
CHECK_KEYS = (
    "actual_teacher_self_generation", "actual_online_student_sampling", "actual_parameters_changed",
    "frozen_teacher_unchanged", "heldout_bytes_not_used_for_training", "no_pretrained_checkpoint_downloaded",
    "original_sif_550_online_path_validated", "extreme_finite_padding_zero_gradients",
    "undefined_tied_weight_policy_rejected", "oversized_corpus_rejected_before_read",
    "fixed_teacher_rl_8x64_and_0_4_8_lineage", "zero_waypoint_gate_still_rejected",
)
# Checks that report whether a component ran at all (a fact, false for methods without it), as
# opposed to a guarantee that must hold when it applies; status flags only the latter when false.
FACT_CHECKS = ("actual_teacher_self_generation", "original_sif_550_online_path_validated")
PROVENANCE_KEYS = (
    "artifact_path", "commit", "uncommitted_source_at_cpu_run", "implementation_sha256", "executed_source_sha256",
    "accelerator", "command", "dataset_fingerprint", "raw_artifact", "previous_cpu_raw_artifacts_retained",
)
FULL_EXPERIMENT_KEYS = ("review_done", "resolution", "available_budget", "cost_basis", "cost_type", "automatic_retry")
TIMING_KEYS = ("tier_seconds", "per_seed_seconds", "corpus_load_seconds", "checks_seconds", "time_goal_seconds",
               "within_time_goal", "torch_threads")


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """mean, sample std (n-1, as in seed 003; None for one seed) and n."""
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else None
    return {"mean": _num(mean), "std": None if std is None else _num(std), "n": n}


def aggregate(per_seed: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The `metrics` block from per-seed entries; the frozen-teacher metric is the largest delta of each seed."""
    metrics = {}
    for key in METRIC_KEYS:
        if key == "frozen_teacher_parameter_delta_l2":
            values = [max(e["frozen_teacher_parameter_deltas_l2"], default=0.0) for e in per_seed]
        else:
            values = [e[key] for e in per_seed]
        metrics[key] = summarize(values)
    return metrics


def _keys(where: str, obj: Any, keys: Sequence[str], optional: Sequence[str] = ()) -> list[str]:
    if not isinstance(obj, Mapping):
        return [f"{where}: must be an object"]
    problems = [f"{where}: missing key {k!r}" for k in keys if k not in obj]
    problems += [f"{where}: unexpected key {k!r}" for k in obj if k not in keys and k not in optional]
    return problems


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


def check_component_record(rec: Mapping[str, Any]) -> list[str]:
    """Every way `rec` departs from the schema of seed 003; an empty list means it conforms."""
    problems = _keys("record", rec, RECORD_KEYS, OPTIONAL_RECORD_KEYS)
    if problems and not isinstance(rec, Mapping):
        return problems
    if rec.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version: must be {SCHEMA_VERSION}, got {rec.get('schema_version')!r}")
    seeds = rec.get("seeds")
    if not isinstance(seeds, list) or not seeds:
        problems.append("seeds: must be a non-empty list")
        seeds = []
    if rec.get("diagnostic_only") is not True or rec.get("promotion_eligible") is not False:
        problems.append("diagnostic_only must be true and promotion_eligible false for a component tier")
    ds = rec.get("dataset", {})
    problems += _keys("dataset", ds, DATASET_KEYS)
    ranges = ds.get("byte_ranges") if isinstance(ds, Mapping) else None
    problems += _keys("dataset.byte_ranges", ranges, SPLITS)
    if isinstance(ranges, Mapping) and all(isinstance(ranges.get(s), list) and len(ranges[s]) == 2 for s in SPLITS):
        bounds = [ranges[s] for s in SPLITS]
        if bounds[0][0] != 0 or any(a[1] != b[0] for a, b in zip(bounds, bounds[1:])) or any(a >= b for a, b in bounds):
            problems.append("dataset.byte_ranges: train/validation/test must be contiguous, non-empty, from 0")
    proto = rec.get("evaluation_protocol", {})
    problems += _keys("evaluation_protocol", proto, PROTOCOL_KEYS)
    if isinstance(proto, Mapping) and proto.get("seeds") != seeds:
        problems.append("evaluation_protocol.seeds: differs from seeds")
    per_seed = rec.get("per_seed")
    if not isinstance(per_seed, list):
        problems.append("per_seed: must be a list")
        per_seed = []
    if [e.get("seed") for e in per_seed if isinstance(e, Mapping)] != seeds:
        problems.append("per_seed: seeds differ from seeds (order included)")
    for i, entry in enumerate(per_seed):
        problems += _keys(f"per_seed[{i}]", entry, PER_SEED_KEYS)
        if not isinstance(entry, Mapping):
            continue
        for j, h in enumerate(entry.get("history") or []):
            problems += _keys(f"per_seed[{i}].history[{j}]", h, HISTORY_KEYS)
        if isinstance(proto, Mapping) and len(entry.get("history") or []) != proto.get("student_steps"):
            problems.append(f"per_seed[{i}].history: {len(entry.get('history') or [])} entries, "
                            f"student_steps is {proto.get('student_steps')}")
    metrics = rec.get("metrics", {})
    problems += _keys("metrics", metrics, METRIC_KEYS)
    if not problems:
        expected = aggregate(per_seed)
        for key in METRIC_KEYS:
            got, want = metrics[key], expected[key]
            if not isinstance(got, Mapping) or set(got) != {"mean", "std", "n"}:
                problems.append(f"metrics.{key}: must be {{mean, std, n}}")
            elif got["n"] != want["n"] or not _close(got["mean"], want["mean"]) or not _close(got["std"], want["std"]):
                problems.append(f"metrics.{key}: {got} disagrees with per_seed ({want})")
    checks = rec.get("execution_checks", {})
    problems += _keys("execution_checks", checks, CHECK_KEYS)
    if isinstance(checks, Mapping):
        for k, v in checks.items():
            if not (isinstance(v, bool) or v == "not_applicable"):
                problems.append(f"execution_checks.{k}: must be true, false or 'not_applicable', got {v!r}")
    problems += _keys("provenance", rec.get("provenance", {}), PROVENANCE_KEYS)
    problems += _keys("full_experiment", rec.get("full_experiment", {}), FULL_EXPERIMENT_KEYS)
    if "timing" in rec:
        problems += _keys("timing", rec["timing"], TIMING_KEYS)
    return problems
