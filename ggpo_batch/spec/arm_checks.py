"""Each arm checked with its own train: the arms grouped by the train their run specs hold (arms
that change nothing share the spec's), and the problems of a group folded into preflight's report,
named after the arm (`arms.lr_hi.train.max_new_tokens`) where the spec's own train does not have them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..contracts.runspec import ArmSpec
    from .experiment import ExperimentSpec


def arm_groups(spec: ExperimentSpec, arms: Sequence[ArmSpec]) -> list[tuple[dict[str, Any], list[ArmSpec]]]:
    """(train, the arms whose runs train with it), the spec's own train first where an arm has it."""
    groups: dict[str, tuple[dict[str, Any], list[ArmSpec]]] = {}
    for arm in arms:
        train = spec.train_of(arm.name)
        groups.setdefault(json.dumps(train, sort_keys=True), (train, []))[1].append(arm)
    own = json.dumps(dict(spec.train), sort_keys=True)
    return sorted(groups.values(), key=lambda g: json.dumps(g[0], sort_keys=True) != own)


def merge_arm_problems(report: Any, arm_report: Any, arms: Sequence[str]) -> None:
    """`arm_report`'s problems into preflight's `report`: one it already holds once; another
    named after the first arm (`arms.A.train.KEY` for a train field, else the field with the arm in
    the message), the other arms of the same train said in the message."""
    have = {(p.field, p.message) for p in report.problems}
    first, others = arms[0], list(arms[1:])
    also = f" (also arm{'s' if len(others) > 1 else ''} {', '.join(others)})" if others else ""
    for p in arm_report.problems:
        if (p.field, p.message) in have:
            continue
        if p.field.startswith("train."):
            report.add(f"arms.{first}.{p.field}", p.message + also, absent=p.absent)
        else:
            report.add(p.field, f"arm {first!r}{also}: {p.message}", absent=p.absent)
