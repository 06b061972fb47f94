"""The rollout audit: each step's rewards, advantages and loss mask re-derived from evidence that
did not produce them, and compared trajectory by trajectory.

The trainer keeps, per step and rank (`StepEvidence`): every trajectory with its id, group, item,
template, length and its turns exactly as the rollout backend returned them (where each turn's
generated tokens were placed in the sequence, and the tokens); the reward its advantages were
computed from; and the loss batch as the loss saw it (targets, loss mask, and per row the advantage
and the id of the trajectory it holds). The audit checks, without the token-source labels the mask
was built from:

1. reward: the verifier re-scores each trajectory from its stored answer text (the final turn's
   generated tokens) against its item's gold answer; the result must be the reward used;
2. advantage: each group's advantages are recomputed from those re-scored rewards and compared
   with the advantage of the loss row holding each trajectory, by trajectory id (never as a sorted
   set); a group whose re-scored rewards are all equal must be dropped and reach no row, every
   trajectory of a retained group reaches exactly one row;
3. mask: a row's loss mask covers exactly the positions of the generated tokens the backend
   reported for its trajectory (as many as it reported, where it placed them, and the row holds the
   backend's tokens there, after its item's re-rendered prompt); a masked prompt, tool-output
   (retrieved passage) or padding position is reported as such, so is a generated token missing
   from the mask; no tool delimiter is ever under the mask;
4. weight sync: after every push of the policy's weights into the rollout backend, the backend's
   log-probs of a fixed sequence matched the policy's within the kernels' noise and were not nearer
   to an earlier policy's (train/probe.py): rollouts came from the weights they are credited to,
   not from a stale copy.

TRAINING_STATUS_VALIDATED (ggpo_batch.contracts.run_record) may be written only when no rank finds a problem;
otherwise the record says TRAINING_STATUS_AUDIT_FAILED and the details file lists every problem.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..rollout.environment import completion_text
from ..task.codec import ByteCodec, Codec
from ..task.qa import Item, score
from ..task.rewards import Rewards

if TYPE_CHECKING:
    from .probe import ProbeLog

# What `audit` checks, as the details file lists it.
CHECKS = (
    "reward: each trajectory re-scored by the verifier from its stored answer text (final turn's generated tokens)",
    ("advantage: each loss row's advantage equals its own trajectory's, recomputed by trajectory id from its "
     "group's re-scored rewards; all-equal groups dropped and absent from the loss"),
    ("mask: each loss row masks exactly the generated-token positions the rollout backend reported for its "
     "trajectory, and holds the backend's tokens there after its item's re-rendered prompt"),
    "mask: no prompt, tool-output (retrieved passage), tool-delimiter or padding token carries loss",
    ("weight sync: after each push into the rollout backend, its log-probs of a fixed sequence are within the "
     "kernels' noise of the policy's (mean gap), and not nearer to an earlier policy (train/probe.py)"),
)
REWARD_TOL = 1e-6
ADVANTAGE_TOL = 1e-5


@dataclass(frozen=True)
class TrajectoryEvidence:
    """One rollout as the audit sees it."""

    traj_id: str  # unique within the run: "s<step>/r<rank>/g<group>/t<index>"
    group: int  # group index within the rank's step
    item: Item
    template: str
    length: int  # tokens of the whole trajectory: prompt, generated turns, tool output
    turns: tuple[tuple[int, tuple[int, ...]], ...]  # per backend call: (offset in the sequence, generated tokens)
    reward: float  # the reward the trainer computed the group's advantages from


@dataclass
class StepEvidence:
    """What one step's loss actually saw on one rank (targets-aligned: target i is token i + 1)."""

    step: int
    trajectories: list[TrajectoryEvidence]
    targets: torch.Tensor  # [B, T-1] int
    loss_mask: torch.Tensor  # [B, T-1] bool
    row_advantages: torch.Tensor  # [B]
    row_trajectories: list[str | None]  # [B] id of the trajectory each row holds; None: a zero-loss filler row
    eps: float


@dataclass
class AuditResult:
    steps_checked: int = 0
    trajectories_checked: int = 0
    rows_checked: int = 0
    generated_tokens_checked: int = 0
    problems: list[str] = field(default_factory=list)
    probes: list[ProbeLog | None] = field(default_factory=list)  # each rank's weight-sync probes (None: no push)
    # Per rank, per step: sha256 of what was rolled out (`rollout_digests`); a rerun must match it.
    rollouts: list[dict[int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.steps_checked > 0 and self.trajectories_checked > 0 and not self.problems

    def details(self) -> dict[str, Any]:
        """The audit's section of the details file: what was checked, how much, and every problem."""
        from .probe import merged_details

        return {"ok": self.ok, "checked": list(CHECKS), "steps_checked": self.steps_checked,
                "trajectories_checked": self.trajectories_checked, "rows_checked": self.rows_checked,
                "generated_tokens_checked": self.generated_tokens_checked, "problems": list(self.problems),
                "weight_sync_probe": merged_details(self.probes),
                "rollouts_sha256": merged_digests(self.rollouts)}


def answer_text(turns: Iterable[tuple[int, tuple[int, ...]]], codec: Codec | None = None,
                item: Item | None = None) -> str:
    """The answer of an episode: what its final turn says (the protocol of environment.run_episodes;
    a single-turn item's whole completion)."""
    turns = list(turns)
    if not turns:
        return ""
    codec = codec or ByteCodec()
    return completion_text(item, list(turns[-1][1]), codec) if item is not None else codec.answer_text(list(turns[-1][1]))


def audit(evidence: Iterable[StepEvidence], codec: Codec | None = None, probe: ProbeLog | None = None,
          rewards: Rewards | None = None) -> AuditResult:
    """Audit every step of `evidence`; `codec` is the policy's (the byte vocabulary's when None); `probe`
    the rank's weight-sync probes (None when its backend samples from the policy module itself);
    `rewards` the run's (None: the retrieval verifier)."""
    codec = codec or ByteCodec()
    res = AuditResult(probes=[probe])
    evidence = list(evidence)
    res.rollouts.append(rollout_digests(evidence))
    if probe is not None:
        res.problems += probe.problems()
    for ev in evidence:
        res.steps_checked += 1
        _audit_step(ev, res, codec, rewards)
    return res


def rollout_digests(evidence: Iterable[StepEvidence]) -> dict[int, str]:
    """Per step, sha256 of its trajectories as the audit sees them (id, item, template, every turn's
    place and tokens): two runs of the same spec and seed must give the same."""
    out = {}
    for ev in evidence:
        h = hashlib.sha256()
        for t in sorted(ev.trajectories, key=lambda t: t.traj_id):
            h.update(repr((t.traj_id, t.item.item_id, t.template, t.length, t.turns)).encode())
        out[ev.step] = h.hexdigest()
    return out


def merged_digests(per_rank: list[dict[int, str]]) -> list[str]:
    """The run's rollout digest per step (in step order), over every rank's in rank order."""
    steps = sorted({s for d in per_rank for s in d})
    return [hashlib.sha256("|".join(d.get(s, "") for d in per_rank).encode()).hexdigest() for s in steps]


def _expected_advantages(ev: StepEvidence, rescored: dict[str, float]) -> dict[str, float | None]:
    """Per trajectory id: its advantage from its group's re-scored rewards; None when the group is dropped."""
    groups: dict[int, list[TrajectoryEvidence]] = {}
    for t in ev.trajectories:
        groups.setdefault(t.group, []).append(t)
    expected: dict[str, float | None] = {}
    for ts in groups.values():
        r = torch.tensor([rescored[t.traj_id] for t in ts], dtype=torch.float32)
        if len(ts) < 2 or float(r.max() - r.min()) <= 0:
            expected.update((t.traj_id, None) for t in ts)
            continue
        a = (r - r.mean()) / (r.std(unbiased=False) + ev.eps)
        expected.update((t.traj_id, float(v)) for t, v in zip(ts, a.tolist()))
    return expected


def _audit_step(ev: StepEvidence, res: AuditResult, codec: Codec, rewards: Rewards | None = None) -> None:
    where = f"step {ev.step}"
    bad = res.problems.append
    by_id: dict[str, TrajectoryEvidence] = {}
    for t in ev.trajectories:
        if t.traj_id in by_id:
            bad(f"{where}: trajectory id {t.traj_id} occurs twice")
        by_id[t.traj_id] = t
    res.trajectories_checked += len(by_id)

    # 1. Rewards, re-scored from the stored answer text.
    rescored: dict[str, float] = {}
    texts = {t.traj_id: answer_text(t.turns, codec, t.item) for t in by_id.values()}
    again = (rewards([t.item for t in by_id.values()], list(texts.values()), count=False) if rewards is not None
             else [score(texts[t.traj_id], t.item) for t in by_id.values()])
    for t, r in zip(by_id.values(), again):
        rescored[t.traj_id] = r
        if not math.isclose(rescored[t.traj_id], t.reward, abs_tol=REWARD_TOL):
            bad(f"{where}: {t.traj_id} was given reward {t.reward:.6g}; the verifier re-scores its answer "
                f"{texts[t.traj_id]!r} at {rescored[t.traj_id]:.6g}")

    # 2. Advantages, tied to trajectory ids.
    expected = _expected_advantages(ev, rescored)
    rows = ev.loss_mask.shape[0]
    if len(ev.row_trajectories) != rows or tuple(ev.row_advantages.shape) != (rows,) \
            or ev.targets.shape != ev.loss_mask.shape:
        bad(f"{where}: the loss batch's rows, advantages, targets and mask disagree in shape")
        return
    placed: dict[str, int] = {}
    for row, tid in enumerate(ev.row_trajectories):
        res.rows_checked += 1
        mask = ev.loss_mask[row].bool()
        if tid is None:
            if bool(mask.any()):
                bad(f"{where} row {row}: a filler row carries loss on {int(mask.sum())} tokens")
            continue
        t = by_id.get(tid)
        if t is None:
            bad(f"{where} row {row}: holds {tid}, which is not a trajectory of this step")
            continue
        if tid in placed:
            bad(f"{where} row {row}: {tid} is already in row {placed[tid]}")
        placed[tid] = row
        want, got = expected[tid], float(ev.row_advantages[row])
        if want is None:
            bad(f"{where} row {row}: {tid} of group {t.group} reached the loss (advantage {got:+.4g}) although "
                f"its group's re-scored rewards are all equal, so the group is dropped")
        elif not math.isclose(got, want, rel_tol=ADVANTAGE_TOL, abs_tol=ADVANTAGE_TOL):
            bad(f"{where} row {row}: {tid} of group {t.group} trained with advantage {got:+.4g}; its group's "
                f"re-scored rewards give it {want:+.4g}")
        _audit_mask(f"{where} row {row}: {tid}", t, mask, ev.targets[row], res, codec)
    for tid, want in expected.items():
        if want is not None and tid not in placed:
            bad(f"{where}: {tid} of retained group {by_id[tid].group} reached no loss row")


def _audit_mask(where: str, t: TrajectoryEvidence, mask: torch.Tensor, targets: torch.Tensor,
                res: AuditResult, codec: Codec) -> None:
    """Compare one row's mask with the generated tokens the backend reported for its trajectory."""
    bad = res.problems.append
    width = mask.shape[0]
    row_tokens = targets.tolist()
    prompt = codec.prompt(t.template, t.item)
    if row_tokens[: len(prompt) - 1] != prompt[1:]:
        bad(f"{where}: the row does not start with the prompt of {t.item.item_id} ({t.template})")
    want = torch.zeros(width, dtype=torch.bool)
    reported = 0
    for off, toks in t.turns:
        reported += len(toks)
        lo, hi = off - 1, off - 1 + len(toks)  # token p is target p - 1
        if not toks:
            continue
        if off < len(prompt) or hi > width:
            bad(f"{where}: a turn placed at token {off} lies outside the generated part of the row")
            continue
        if bool(want[lo:hi].any()):
            bad(f"{where}: two turns claim the same token positions")
        want[lo:hi] = True
        if row_tokens[lo:hi] != list(toks):
            bad(f"{where}: the row's tokens at {off}..{off + len(toks) - 1} are not the tokens the backend "
                f"generated there")
    res.generated_tokens_checked += reported
    masked = int(mask.sum())
    if masked != reported:
        bad(f"{where}: {masked} tokens under the loss mask, the backend reported {reported} generated")
    extra = torch.nonzero(mask & ~want).flatten() + 1  # token positions
    if extra.numel():
        n_prompt = int((extra < len(prompt)).sum())
        n_pad = int((extra >= t.length).sum())
        for n, what in ((n_prompt, "prompt"), (extra.numel() - n_prompt - n_pad, "tool-output (retrieved passage)"),
                        (n_pad, "padding")):
            if n:
                bad(f"{where}: {n} {what} token(s) under the loss mask")
    missing = int((want & ~mask).sum())
    if missing:
        bad(f"{where}: {missing} generated token(s) missing from the loss mask")
    if codec.env_only_ids and bool((torch.isin(targets, torch.tensor(codec.env_only_ids)) & mask).any()):
        bad(f"{where}: tool delimiter tokens under the loss mask")
