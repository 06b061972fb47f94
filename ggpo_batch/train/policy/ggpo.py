"""The ggpo update: group-relative advantages and the clipped, KL-regularised token loss.

ggpo (group-relative policy optimisation), as this project defines it:

1. For each prompt, a group of G rollouts is sampled from a *behaviour* copy of the policy
   (re-synced from the policy after every update); a verifier gives each rollout a reward.
2. A group whose rewards are all equal carries no signal and is dropped (it is counted as
   rejected); the others are retained.
3. Each retained rollout gets advantage A = (r - mean_group(r)) / (std_group(r) + eps), with the
   population std of its group. A is applied to the policy's own generated tokens only: the loss
   mask excludes prompt, tool output, retrieved text and padding.
4. Per generated token t: ratio_t = exp(logp_t - logp_old_t); the loss is the token-level
   mean of  -w_t min(ratio_t A, clip(ratio_t, 1-eps_clip, 1+eps_clip) A) + beta * KL_t,  where KL_t is
   the non-negative k3 estimator of KL(policy || reference) and the reference model is refreshed
   from the policy every K updates. The "old" log-probs are the policy's own before the update
   (`[train] old_logprobs`, both choices): the rollout engine's kernels differ from the trainer's
   (bfloat16), and a ratio against the engine's log-probs would clip on that mismatch. With
   old_logprobs = "rollout" the engine's log-probs enter through a truncated importance-sampling
   weight w_t = min(exp(logp_old_t - logp_rollout_t), C) (TRL's vllm_importance_sampling_correction,
   "token_truncate"); with "policy" (the default, as verl) w_t = 1.

This module is pure torch and is the one implementation used by both the training job
(`ggpo_batch.train`) and the nightly CPU components (`ggpo_batch.nightly`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ggpo_config import GgpoConfig


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of a batch of groups, and which groups were kept."""

    advantages: torch.Tensor  # [groups, G], zero in dropped groups
    retained: torch.Tensor  # [groups] bool
    raw_gap: float  # mean (max - min) reward over retained groups; 0.0 when none

    @property
    def retained_groups(self) -> int:
        return int(self.retained.sum().item())

    @property
    def rejected_groups(self) -> int:
        return int((~self.retained).sum().item())


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> GroupAdvantages:
    """Group-relative advantages of `rewards` shaped [groups, G]; all-equal groups are dropped."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [groups, G>=2], got {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float32)
    gap = rewards.max(dim=1).values - rewards.min(dim=1).values
    retained = gap > 0
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, unbiased=False, keepdim=True)
    adv = (rewards - mean) / (std + eps)
    adv = torch.where(retained[:, None], adv, torch.zeros_like(adv))
    raw_gap = float(gap[retained].mean().item()) if bool(retained.any()) else 0.0
    return GroupAdvantages(advantages=adv, retained=retained, raw_gap=raw_gap)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-probability of each target token: logits [B, T, V] (predicting targets [B, T]) -> [B, T].
    Materialises [B, T, V] float32: the trainer uses train/logprobs.py's chunked equivalent."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def truncated_is_weights(policy_old: torch.Tensor, rollout: torch.Tensor, loss_mask: torch.Tensor,
                         cap: float) -> torch.Tensor:
    """Per-token importance weights min(exp(policy_old - rollout), cap) of the rollout engine's samples
    (1 outside the mask), detached: what corrects for sampling from the engine's kernels."""
    keep = loss_mask.bool()
    diff = torch.where(keep, policy_old.detach() - rollout.detach(), torch.zeros((), dtype=policy_old.dtype,
                                                                                  device=policy_old.device))
    return torch.exp(diff).clamp(max=cap)


@dataclass(frozen=True)
class LossStats:
    """What one loss evaluation saw; floats, detached."""

    policy_loss: float
    kl: float
    clip_fraction: float
    loss_tokens: int
    nonzero_advantage_tokens: int


def ggpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: GgpoConfig,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The ggpo loss over a batch of sequences.

    logprobs, old_logprobs, reference_logprobs, loss_mask: [B, T] over the same target tokens;
    advantages: [B] (one per rollout). loss_mask is True only on the policy's own generated tokens.
    is_weights [B, T] (`truncated_is_weights`) scale each token's policy term; None: 1.
    Returns the scalar loss (a token-level mean over the mask) and detached statistics.
    """
    if not (logprobs.shape == old_logprobs.shape == reference_logprobs.shape == loss_mask.shape):
        raise ValueError("logprobs, old_logprobs, reference_logprobs and loss_mask must share a shape")
    if is_weights is not None and is_weights.shape != logprobs.shape:
        raise ValueError("is_weights must have the shape of logprobs")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(logprobs.shape[:1])}, got {tuple(advantages.shape)}")
    keep = loss_mask.bool()
    mask = keep.to(logprobs.dtype)
    # Zero every log-prob outside the mask BEFORE exp(): a padding sentinel such as -1e4 would
    # overflow to inf, and inf x 0 is NaN, in the loss and in the gradient.
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    logprobs = torch.where(keep, logprobs, zero)
    old_logprobs = torch.where(keep, old_logprobs, zero)
    reference_logprobs = torch.where(keep, reference_logprobs, zero)
    adv = advantages.to(logprobs.dtype)[:, None]
    ratio = torch.exp(logprobs - old_logprobs.detach())
    clipped = torch.clamp(ratio, 1.0 - config.clip_epsilon, 1.0 + config.clip_epsilon)
    policy_term = -torch.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        policy_term = policy_term * is_weights.detach()
    log_ref_ratio = reference_logprobs.detach() - logprobs
    kl_term = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
    per_token = policy_term + config.kl_coef * kl_term
    tokens = mask.sum()
    denom = tokens.clamp(min=1.0)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        clip_hit = ((ratio - clipped).abs() > 0).to(mask.dtype)
        nonzero_adv_tokens = int(((adv != 0).to(mask.dtype) * mask).sum().item())
        stats = LossStats(
            policy_loss=float(((policy_term * mask).sum() / denom).item()),
            kl=float(((kl_term * mask).sum() / denom).item()),
            clip_fraction=float(((clip_hit * mask).sum() / denom).item()),
            loss_tokens=int(tokens.item()),
            nonzero_advantage_tokens=nonzero_adv_tokens,
        )
    return loss, stats
