"""One training step's figures, as its history entry records them: the rank's own sums while the
step runs, then the whole step's over every rank (`reduce`, a collective).

Beside the loss and gradient norm, the first health figures a researcher reads: the step's mean
reward; the mean and 99th percentile of |rollout engine - policy| log-prob over the tokens under the
loss (the kernels' mismatch; with the torch sampler, which is the policy, about 0); the PPO clip
fraction and the KL term of the ggpo loss (token means); with `old_logprobs = "rollout"` the mean
importance weight and the share of tokens truncated at the cap. And what the update cost: its passes
(every rank runs as many; the filler passes of ranks that needed fewer) and the loss rows' tokens,
padded as the passes pad them and unpadded, summed over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..rollout.environment import Trajectory
from .ggpo import GroupAdvantages, LossStats
from .passes import Pass

# The sums reduced over ranks, in this order.
_SUMS = ("loss", "retained", "raw_gap", "generated_tokens", "trajectories", "groups", "reward", "loss_tokens", "kl",
         "clip", "is_weight", "is_truncated", "padded_tokens", "nonpadding_tokens", "filler_passes")


@dataclass
class StepFigures:
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUMS, 0.0))
    gaps: list[torch.Tensor] = field(default_factory=list)  # |rollout - policy| of the rank's loss tokens
    importance_weighted: bool = False
    gradient_norm: float | None = None
    reference_refreshed: bool = False
    step_seconds: float = 0.0
    gap_mean: float | None = None
    gap_p99: float | None = None
    passes: int = 0  # the step's forward/backward passes, the same on every rank (trainer._plan)

    @classmethod
    def local(cls, rewards: torch.Tensor, adv: GroupAdvantages, trajs: list[list[Trajectory]],
              groups: int) -> StepFigures:
        """The rank's rollout figures: rewards [groups, G], their advantages, its trajectories."""
        f = cls()
        gaps = (rewards.max(1).values - rewards.min(1).values)[adv.retained]
        f.sums.update(retained=float(adv.retained_groups), raw_gap=float(gaps.sum()),
                      generated_tokens=float(sum(t.generated_tokens for ts in trajs for t in ts)),
                      trajectories=float(sum(len(ts) for ts in trajs)), groups=float(groups),
                      reward=float(rewards.sum()))
        return f

    @property
    def loss(self) -> float:
        return self.sums["loss"]

    @loss.setter
    def loss(self, value: float) -> None:
        self.sums["loss"] = value

    def add_pass(self, stats: LossStats, rollout: torch.Tensor, policy_old: torch.Tensor, mask: torch.Tensor,
                 is_weights: torch.Tensor | None, cap: float) -> None:
        """One forward/backward pass: its loss statistics, the gaps of its tokens, its importance weights."""
        keep = mask.bool()
        n = float(stats.loss_tokens)
        self.sums["loss_tokens"] += n
        self.sums["kl"] += stats.kl * n
        self.sums["clip"] += stats.clip_fraction * n
        self.gaps.append((rollout.detach() - policy_old.detach())[keep].abs().float().cpu())
        if is_weights is not None:
            self.importance_weighted = True
            w = is_weights.detach()[keep]
            self.sums["is_weight"] += float(w.sum())
            self.sums["is_truncated"] += float((w >= cap).sum())

    def add_passes(self, passes: list[Pass], nonpadding_tokens: int) -> int:
        """The step's passes on this rank: their count, its filler passes, and the tokens of its loss rows
        unpadded and padded as the passes pad them (each to its pass's longest row); returns the padded."""
        padded = sum(p.padded_tokens for p in passes)
        self.passes = len(passes)
        self.sums["filler_passes"] += sum(not p.rows for p in passes)
        self.sums["padded_tokens"] += padded
        self.sums["nonpadding_tokens"] += nonpadding_tokens
        return padded

    def reduce(self, device: torch.device, step_seconds: float) -> None:
        """Sum over ranks (collective); the step's seconds are the slowest rank's (ranks stop together)."""
        vec = torch.tensor([self.sums[k] for k in _SUMS], dtype=torch.float64, device=device)
        dist.all_reduce(vec, op=dist.ReduceOp.SUM)
        self.sums = dict(zip(_SUMS, vec.tolist()))
        slowest = torch.tensor([step_seconds], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        self.step_seconds = float(slowest[0])
        mine = torch.cat(self.gaps) if self.gaps else torch.zeros(0)
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        gaps = torch.cat(every).double().numpy()
        if gaps.size:  # numpy's quantile: torch's refuses more than 16M values (a large step's tokens)
            self.gap_mean, self.gap_p99 = float(gaps.mean()), float(np.quantile(gaps, 0.99))

    def history_entry(self, step: int, *, world: int, branch: str, loop_seconds: float,
                      weight_sync_seconds: float | None, probe: dict[str, Any] | None) -> dict[str, Any]:
        """The step's entry of `LoopState.history` (after `reduce`)."""
        s = self.sums
        retained, tokens = int(s["retained"]), s["loss_tokens"]
        per_token = (lambda key: s[key] / tokens if tokens else None)
        return {
            "step": step, "loss": s["loss"] / world, "gradient_norm": self.gradient_norm,
            "retained_groups": retained, "rejected_groups": int(s["groups"]) - retained,
            "raw_gap": s["raw_gap"] / retained if retained else 0.0,
            "mean_length": s["generated_tokens"] / max(1.0, s["trajectories"]),
            "reference_refreshed": self.reference_refreshed, "branch": branch, "loop_seconds": loop_seconds,
            "weight_sync_seconds": weight_sync_seconds,
            "mean_reward": s["reward"] / s["trajectories"] if s["trajectories"] else None,
            "logprob_gap_mean": self.gap_mean, "logprob_gap_p99": self.gap_p99,
            "clip_fraction": per_token("clip"), "kl": per_token("kl"),
            "is_weight_mean": per_token("is_weight") if self.importance_weighted else None,
            "is_truncated_fraction": per_token("is_truncated") if self.importance_weighted else None,
            "weight_sync_probe": probe,
            "passes": self.passes, "passes_padded_tokens": int(s["padded_tokens"]),
            "passes_nonpadding_tokens": int(s["nonpadding_tokens"]), "filler_passes": int(s["filler_passes"]),
        }
