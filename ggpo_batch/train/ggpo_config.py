"""The ggpo hyperparameters, importable without torch (spec validation reads them)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class GgpoConfig:
    """Hyperparameters of the ggpo update: the one declaration. The training job's `[train]`
    (TrainConfig) and the nightly tier's `[ggpo]` (GgpoTierConfig) extend it, so a key means the
    same thing, with the same default and the same checks, everywhere."""

    group_size: int = 4  # G rollouts per prompt
    clip_epsilon: float = 0.2
    kl_coef: float = 0.02
    reference_refresh_steps: int = 4  # the reference takes the policy's weights every K updates
    advantage_eps: float = 1e-6

    def __post_init__(self) -> None:
        for key, problem in self.ggpo_problems():
            raise ValueError(f"{key} {problem}")

    def ggpo_problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for each invalid hyperparameter; empty when all are valid."""
        out = []
        if self.group_size < 2:
            out.append(("group_size", "must be >= 2: a group of one has no relative signal"))
        if not 0 < self.clip_epsilon < 1:
            out.append(("clip_epsilon", "must be in (0, 1)"))
        if self.kl_coef < 0:
            out.append(("kl_coef", "must be >= 0"))
        if self.reference_refresh_steps < 1:
            out.append(("reference_refresh_steps", "must be >= 1"))
        if self.advantage_eps < 0:
            out.append(("advantage_eps", "must be >= 0"))
        return out

    @property
    def ggpo(self) -> GgpoConfig:
        """Just the ggpo hyperparameters (of a config that extends this one)."""
        return GgpoConfig(**{f.name: getattr(self, f.name) for f in fields(GgpoConfig)})
