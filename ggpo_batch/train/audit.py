"""The post-training audit: every step's loss mask and advantages, re-checked from what was kept.

The status REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED may be written only when this passes on
every rank: the mask covers exactly the policy's generated tokens (never prompt, tool output,
retrieved text or padding), tool tokens never sit under the mask, and each retained group's
advantages are its rewards standardised (mean 0) while dropped groups never reach the loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .environment import GENERATED
from .tokenizer import DOC_CLOSE, DOC_OPEN


@dataclass
class StepEvidence:
    """What one step's loss actually saw on one rank (targets-aligned, i.e. shifted by one)."""

    step: int
    targets: torch.Tensor  # [B, T-1] int
    sources: torch.Tensor  # [B, T-1] uint8 source of each target token
    loss_mask: torch.Tensor  # [B, T-1] bool
    row_advantages: torch.Tensor  # [B]
    row_groups: torch.Tensor  # [B] group index within the step
    group_rewards: torch.Tensor  # [groups, G]
    group_retained: torch.Tensor  # [groups] bool
    eps: float


@dataclass
class AuditResult:
    steps_checked: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.steps_checked > 0 and not self.problems


def audit(evidence: list[StepEvidence]) -> AuditResult:
    res = AuditResult()
    for ev in evidence:
        res.steps_checked += 1
        where = f"step {ev.step}"
        want = ev.sources == GENERATED
        if not torch.equal(ev.loss_mask, want):
            res.problems.append(f"{where}: loss mask differs from the generated-token positions "
                                f"({int((ev.loss_mask != want).sum())} tokens)")
        tool = (ev.targets == DOC_OPEN) | (ev.targets == DOC_CLOSE)
        if bool((tool & ev.loss_mask).any()):
            res.problems.append(f"{where}: tool delimiter tokens under the loss mask")
        for g in range(ev.group_rewards.shape[0]):
            rows = ev.row_groups == g
            r = ev.group_rewards[g].float()
            if not bool(ev.group_retained[g]):
                if bool(rows.any()):
                    res.problems.append(f"{where}: dropped group {g} reached the loss")
                if float(r.max() - r.min()) > 0:
                    res.problems.append(f"{where}: group {g} was dropped although its rewards differ")
                continue
            expect = (r - r.mean()) / (r.std(unbiased=False) + ev.eps)
            got = ev.row_advantages[rows]
            if got.numel() != r.numel() or not torch.allclose(torch.sort(got).values, torch.sort(expect).values,
                                                               atol=1e-5):
                res.problems.append(f"{where}: group {g} advantages are not its standardised rewards")
            elif abs(float(got.mean())) > 1e-4:
                res.problems.append(f"{where}: group {g} advantages do not have mean 0")
    return res
