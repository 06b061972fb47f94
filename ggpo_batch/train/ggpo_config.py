"""The ggpo hyperparameters, importable without torch (spec validation reads them)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..contracts import spec_fields

_D = spec_fields.default


@dataclass(frozen=True)
class GgpoConfig:
    """Hyperparameters of the ggpo update: the one declaration. The training job's `[train]`
    (TrainConfig) and the nightly tier's `[ggpo]` (GgpoTierConfig) extend it, so a key means the
    same thing, with the same default and the same checks, everywhere: those of the spec's field
    table (`train.<key>` in ggpo_batch/contracts/spec_fields.py)."""

    group_size: int = _D("train.group_size")  # G rollouts per prompt
    clip_epsilon: float = _D("train.clip_epsilon")
    kl_coef: float = _D("train.kl_coef")
    reference_refresh_steps: int = _D("train.reference_refresh_steps")  # the reference takes the policy's weights every K updates
    advantage_eps: float = _D("train.advantage_eps")

    def __post_init__(self) -> None:
        for key, problem in self.ggpo_problems():
            raise ValueError(f"{key} {problem}")

    def ggpo_problems(self) -> list[tuple[str, str]]:
        """(field, what is wrong) for each invalid hyperparameter; empty when all are valid."""
        out = []
        for f in fields(GgpoConfig):
            problem = spec_fields.field(f"train.{f.name}").problem(getattr(self, f.name))
            if problem is not None:
                out.append((f.name, problem))
        return out

    @property
    def ggpo(self) -> GgpoConfig:
        """Just the ggpo hyperparameters (of a config that extends this one)."""
        return GgpoConfig(**{f.name: getattr(self, f.name) for f in fields(GgpoConfig)})
