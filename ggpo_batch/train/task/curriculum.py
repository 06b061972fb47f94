"""Which groups each step trains on: ordinary training items plus the arm's exposures.

Arms (seeds/000): `clean` exposes nothing. `paired` exposes a fixed set of held-out items, each
through every template of the arm in ONE shared group (G/len(templates) rollouts per template,
advantages relative across the templates). `random` makes the same number of exposures, each
(item, template) drawn at random from the held-out pool and given its own, unshared group.
The schedule is a pure function of (seed, step), so every rank and a resumed job agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ...contracts.runspec import ArmSpec
from ...errors import SpecError
from .qa import TEMPLATES, Item, TaskData


@dataclass(frozen=True)
class GroupSpec:
    """One group of G rollouts; each (item, template) part gets G / len(parts) of them."""

    parts: tuple[tuple[Item, str], ...]
    exposure: bool = False
    shared: bool = False


class Curriculum:
    def __init__(self, arm: ArmSpec, data: TaskData, *, group_size: int, prompts_per_step: int,
                 exposures_per_step: int, seed: int) -> None:
        self.arm, self.data, self.seed = arm, data, seed
        self.prompts_per_step = prompts_per_step
        self.exposure_groups: list[GroupSpec] = []
        if arm.exposure == "none":
            self.groups_per_step = 0
            return
        for t in arm.templates:
            if t not in TEMPLATES:
                raise SpecError("<run spec>", f"arms.{arm.name}.templates", f"unknown template {t!r} "
                                f"(known: {', '.join(sorted(TEMPLATES))})")
        if not arm.templates:
            raise SpecError("<run spec>", f"arms.{arm.name}.templates", "an exposure arm needs templates")
        if not 0 < arm.exposed_items <= len(data.heldout):
            raise SpecError("<run spec>", f"arms.{arm.name}.exposed_items",
                            f"must be in 1..{len(data.heldout)} (held-out items), got {arm.exposed_items}")
        rng = random.Random(f"exposure/{seed}")
        if arm.exposure == "paired":
            if group_size % len(arm.templates):
                raise SpecError("<run spec>", "train.group_size",
                                f"{group_size} is not divisible by the {len(arm.templates)} templates of a shared group")
            for item in data.heldout[: arm.exposed_items]:
                self.exposure_groups.append(GroupSpec(tuple((item, t) for t in arm.templates), True, True))
            per_group = len(arm.templates)
        else:
            for t in arm.templates:
                for item in rng.sample(list(data.heldout), arm.exposed_items):
                    self.exposure_groups.append(GroupSpec(((item, t),), True, False))
            rng.shuffle(self.exposure_groups)
            per_group = 1
        self.groups_per_step = min(prompts_per_step, max(1, exposures_per_step // per_group))

    def step_groups(self, step: int) -> list[GroupSpec]:
        """The step's groups in a fixed global order (ranks take their slice)."""
        start = step * self.groups_per_step
        exposed = self.exposure_groups[start : start + self.groups_per_step]
        rng = random.Random(f"train/{self.seed}/{step}")
        ordinary = [GroupSpec(((rng.choice(self.data.train), "train"),))
                    for _ in range(self.prompts_per_step - len(exposed))]
        return exposed + ordinary

    def trained_items(self, steps: int) -> set[str]:
        """Ids of every item the first `steps` steps trained on, on any rank (ordinary training items
        and the arm's exposures): an item in it is "exposed" in any evaluation of the run."""
        return {item.item_id for step in range(steps) for g in self.step_groups(step) for item, _ in g.parts}
