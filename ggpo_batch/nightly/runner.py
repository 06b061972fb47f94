"""`ggpo-batch nightly`: run each method's CPU component tier over fixed seeds and build its
schema-2 record (seeds/003): metrics over seeds, per-seed histories, computed execution checks,
provenance and timing; optionally write it as a JSON artifact."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..contracts.code_provenance import executed_sources, git_commit, relative_to_checkout, sha256_path, uncommitted
from ..errors import GgpoError
from ..train.policy import ggpo as ggpo_module
from . import ggpo_tier
from .checks import (
    NOT_APPLICABLE,
    extreme_finite_padding_zero_gradients,
    oversized_corpus_rejected_before_read,
)
from .component_record import SCHEMA_VERSION, aggregate, check_component_record
from .corpus import ByteSplit, Corpus, load_corpus
from .policy import PolicyConfig
from .suite import Suite, load_suite
from .watch import watching

log = logging.getLogger(__name__)

# method -> (one-seed runner, implementation module whose sha256 the record names)
METHODS: dict[str, tuple[Callable[..., ggpo_tier.SeedOutcome], Any]] = {"ggpo": (ggpo_tier.run_seed, ggpo_module)}
COMPONENTS_OF_OTHER_METHODS = ("sif", "tf_opd", "waypoint", "cce", "waypoint_teacher_rl")
SELECTION = "none; fixed budgets, final heldout NLL only"
CLAIM_POLICY = "actual component execution only; not paper benchmark, capability comparison or correctness improvement"


def _retain_previous(output: Path) -> list[str]:
    """An existing artifact is never overwritten: it is renamed `<stem>.previous-<k><suffix>`."""
    if output.exists():
        k = 1
        while (prev := output.with_name(f"{output.stem}.previous-{k}{output.suffix}")).exists():
            k += 1
        output.rename(prev)
        log.info("kept the previous artifact as %s", prev)
    return sorted(relative_to_checkout(p) for p in output.parent.glob(f"{output.stem}.previous-*{output.suffix}"))


def write_record(record: Mapping[str, Any], output: Path) -> str:
    """Write the record atomically as JSON; returns the artifact's sha256 (for the ledger)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode()
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, output)
    return hashlib.sha256(data).hexdigest()


def _full_experiment(suite: Suite, given: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    merged = {"status": suite.full_experiment_status, **suite.full_experiment, **(given or {})}
    status = str(merged.pop("status"))
    return status, merged


def _dataset(corpus: Corpus, split: ByteSplit) -> dict[str, Any]:
    return {
        "id": corpus.id,
        "revision": f"sha256:{corpus.sha256}",
        "source_url": corpus.source_url,
        "source_sha256": corpus.sha256,
        "byte_ranges": {name: list(bounds) for name, bounds in split.ranges.items()},
    }


def _protocol(suite: Suite, seeds: Sequence[int], split: ByteSplit, method: str) -> dict[str, Any]:
    ranges = sorted(split.ranges.values())
    disjoint = all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))
    b = suite.budgets
    proto: dict[str, Any] = {
        "tier": suite.tier,
        "formal_comparison": False,
        "seeds": list(seeds),
        "selection": SELECTION,
        "claim_policy": CLAIM_POLICY,
        "model": PolicyConfig(width=suite.width).describe(),
        "separate_train_validation_test": disjoint,
        "teacher_steps": b.teacher_steps,
        "specialist_steps": b.specialist_steps,
        "student_steps": b.student_steps,
        "max_new_tokens": b.max_new_tokens,
    }
    for comp in COMPONENTS_OF_OTHER_METHODS:
        proto[comp] = f"{NOT_APPLICABLE}: method {method} does not run this component"
    return proto


def _checks(outcomes: Sequence[ggpo_tier.SeedOutcome], observed_checkpoints: int, observed_connections: int,
            oversized_ok: bool, padding_ok: bool) -> dict[str, Any]:
    entries = [o.entry for o in outcomes]
    return {
        "actual_teacher_self_generation": any(o.teacher_sampled_tokens > 0 for o in outcomes),
        "actual_online_student_sampling": all(
            o.behaviour_matched_student_at_sampling and 0 < o.student_sampled_tokens == o.entry["generated_tokens"]
            for o in outcomes),
        "actual_parameters_changed": all(e["parameter_delta_l2"] > 0 for e in entries),
        "frozen_teacher_unchanged": all(
            max(e["frozen_teacher_parameter_deltas_l2"] + e["frozen_rl_snapshot_parameter_deltas_l2"]) == 0
            for e in entries),
        "heldout_bytes_not_used_for_training": all(
            o.windows_served > 0 and o.heldout_bytes_trained == 0 for o in outcomes),
        "no_pretrained_checkpoint_downloaded": observed_checkpoints == 0 and observed_connections == 0,
        # SIF, waypoint and the tied-weight policy belong to other methods/models: BytePolicy has
        # separate input and output weights, so there is no tied-weight policy to reject.
        "original_sif_550_online_path_validated": NOT_APPLICABLE,
        "extreme_finite_padding_zero_gradients": padding_ok,
        "undefined_tied_weight_policy_rejected": NOT_APPLICABLE,
        "oversized_corpus_rejected_before_read": oversized_ok,
        "fixed_teacher_rl_8x64_and_0_4_8_lineage": NOT_APPLICABLE,
        "zero_waypoint_gate_still_rejected": NOT_APPLICABLE,
    }


def run_method(method: str, *, suite: Suite, seeds: Sequence[int], corpus: Corpus, command: str,
               output: Path | None, full_experiment: Mapping[str, Any] | None,
               corpus_load_seconds: float = 0.0) -> dict[str, Any]:
    """One method's record; written to `output` when given (an earlier file there is retained)."""
    if method not in METHODS:
        raise GgpoError(f"--methods: unknown method {method!r} (known: {', '.join(sorted(METHODS))})")
    runner, implementation = METHODS[method]
    t0 = time.perf_counter()
    split = ByteSplit.of(corpus, suite.split)
    per_seed_seconds: list[float] = []
    outcomes = []
    with watching() as seen:
        for seed in seeds:
            t = time.perf_counter()
            outcomes.append(runner(seed, split, suite.budgets, suite.ggpo, suite.width))
            per_seed_seconds.append(round(time.perf_counter() - t, 4))
    tc = time.perf_counter()
    padding_ok = extreme_finite_padding_zero_gradients(suite.ggpo.ggpo)
    oversized_ok = oversized_corpus_rejected_before_read(suite.corpus.max_bytes)
    checks_seconds = time.perf_counter() - tc
    checks = _checks(outcomes, len(seen.checkpoints_opened()), len(seen.connections), oversized_ok, padding_ok)
    per_seed = [o.entry for o in outcomes]
    status, full = _full_experiment(suite, full_experiment)

    impl_path = Path(implementation.__file__)
    sources = executed_sources(extra=[suite.path])
    previous = _retain_previous(output) if output is not None else []
    tier_seconds = time.perf_counter() - t0 + corpus_load_seconds
    record = {
        "schema_version": SCHEMA_VERSION,
        "method": method,
        "manifest_ref": f"post-training:{method}",
        "adapter": None,
        "evaluation_tier": suite.tier,
        "measured_locally": True,
        "seeds": list(seeds),
        "diagnostic_only": True,
        "promotion_eligible": False,
        "evolve_integrated": False,
        "dataset": _dataset(corpus, split),
        "evaluation_protocol": _protocol(suite, seeds, split, method),
        "metrics": aggregate(per_seed),
        "per_seed": per_seed,
        "execution_checks": checks,
        "provenance": {
            "artifact_path": relative_to_checkout(output) if output is not None else None,
            "commit": git_commit(),
            "uncommitted_source_at_cpu_run": uncommitted(list(sources)),
            "implementation_sha256": sha256_path(impl_path),
            "executed_source_sha256": sources,
            "accelerator": ",".join(sorted({o.device for o in outcomes})),
            "command": command,
            "dataset_fingerprint": f"sha256:{corpus.sha256}",
            "raw_artifact": relative_to_checkout(output) if output is not None else None,
            "previous_cpu_raw_artifacts_retained": previous,
        },
        "full_experiment_status": status,
        "full_experiment": full,
        "timing": {
            "tier_seconds": round(tier_seconds, 4),
            "per_seed_seconds": per_seed_seconds,
            "corpus_load_seconds": round(corpus_load_seconds, 4),
            "checks_seconds": round(checks_seconds, 4),
            "time_goal_seconds": suite.time_goal_seconds,
            "within_time_goal": tier_seconds < suite.time_goal_seconds,
            "torch_threads": torch.get_num_threads(),
        },
    }
    problems = check_component_record(record)
    if problems:  # a bug in this module, not a user error
        raise AssertionError("component record breaks its own schema: " + "; ".join(problems))
    if output is not None:
        write_record(record, output)
    return record


def run_nightly(*, seeds: Sequence[int], methods: Sequence[str], corpus: Path | None, corpus_sha256: str | None,
                output: Path | None, command: str, full_experiment: Mapping[str, Any] | None = None,
                suite: Suite | None = None) -> dict[str, Any] | list[dict[str, Any]]:
    """Run the tier; returns the record (a dict) for one method, a list of records for several.

    With several methods and an `output`, each record goes to `<stem>-<method><suffix>`.
    `full_experiment` (status + the seed's full_experiment keys) overrides the suite's default
    decision. Raises GgpoError (CorpusError) for a missing, oversized or wrong-sha256 corpus.
    """
    suite = suite or load_suite()
    if not seeds or len(set(seeds)) != len(seeds):
        raise GgpoError(f"--seeds: need distinct seeds, got {list(seeds)}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise GgpoError(f"--methods: unknown method {unknown[0] if unknown else ''!r} (known: {', '.join(METHODS)})")
    t = time.perf_counter()
    data = load_corpus(suite.corpus, path=corpus, expected_sha256=corpus_sha256)
    load_seconds = time.perf_counter() - t
    records = []
    for method in methods:
        out = output
        if output is not None and len(methods) > 1:
            out = output.with_name(f"{output.stem}-{method}{output.suffix}")
        records.append(run_method(method, suite=suite, seeds=seeds, corpus=data, command=command, output=out,
                                  full_experiment=full_experiment, corpus_load_seconds=load_seconds))
    return records[0] if len(records) == 1 else records
