"""Comparing a run that was interrupted (preempted, requeued, stopped at its time limit) with its
uninterrupted twin: step by step to 1e-6, the same counts, the same trained policy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ggpo_batch.contracts.run_record import check_run_record, entry_key

# Per-step figures compared between a resumed run and its uninterrupted twin.
STEP_FIGURES = ("loss", "gradient_norm", "retained_groups", "rejected_groups", "raw_gap", "mean_length")
TOLERANCE = 1e-6


def step_differences(twin: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> list[str]:
    """Every step figure that differs by more than TOLERANCE, and steps one history lacks."""
    out = []
    mine = {h["step"]: h for h in resumed}
    for h in twin:
        r = mine.get(h["step"])
        if r is None:
            out.append(f"step {h['step']} missing")
            continue
        for k in STEP_FIGURES:
            a, b = h[k], r[k]
            if (a is None) != (b is None) or (a is not None and not math.isclose(a, b, rel_tol=0, abs_tol=TOLERANCE)):
                out.append(f"step {h['step']} {k}: {a!r} vs {b!r}")
    if [h["step"] for h in resumed] != [h["step"] for h in twin]:
        out.append(f"steps {[h['step'] for h in resumed]} vs {[h['step'] for h in twin]}")
    return out


def weight_difference(twin_details: dict, resumed_details: dict) -> float:
    """The largest difference between the two runs' exported policies: 0 when they are the same
    bytes (a resume in the same environment is bitwise exact); else compared tensor by tensor (a job
    under Slurm and a local twin may differ in the last bits, from their reductions' order)."""
    if resumed_details["policy_sha256"] == twin_details["policy_sha256"]:
        return 0.0
    from safetensors.torch import load_file

    a, b = (load_file(Path(d["policy_dir"]) / "model.safetensors") for d in (twin_details, resumed_details))
    assert set(a) == set(b)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def assert_same_run(twin: dict, twin_details: dict, resumed: dict, resumed_details: dict, steps: int) -> None:
    assert step_differences(twin_details["history"], resumed_details["history"]) == []
    assert len(resumed_details["history"]) == steps
    assert resumed["training"]["counts"] == twin["training"]["counts"]  # same trajectories, tokens, groups
    assert resumed["training"]["cost"] == twin["training"]["cost"]
    assert resumed["budget"]["exposure_templates"] == twin["budget"]["exposure_templates"]
    diff = weight_difference(twin_details, resumed_details)
    assert diff <= TOLERANCE, f"trained weights differ by {diff}"  # the same trained weights
    assert resumed_details["audit"]["steps_checked"] == twin_details["audit"]["steps_checked"] == steps
    assert resumed["training"]["status"] == twin["training"]["status"]
    assert check_run_record(entry_key(resumed["seed"], resumed["arm"]), resumed) == []
    assert resumed_details["resumed"] is True and twin_details["resumed"] is False
