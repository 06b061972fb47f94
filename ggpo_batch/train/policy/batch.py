"""One step's loss batch, as pure functions of the step's trajectories: the rows the loss sees
(retained groups only), their collation, the audit's evidence of them, and one packed pass's slice of
them (train/passes.py plans the passes); plus the loop state a resumed job restores. No DeepSpeed
here, so a test can build a batch without an engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..audit.audit import StepEvidence, TrajectoryEvidence
from ..rollout.environment import GENERATED, PAD_SOURCE, Trajectory
from ..task.tokenizer import EOS
from .passes import Pass, pad_to, plan

if TYPE_CHECKING:
    from .ggpo import GroupAdvantages


def collate(rows: list[tuple[list[int], list[int], list[float]]], pad_id: int = EOS) -> tuple[torch.Tensor, ...]:
    """Right-pad (tokens, sources, behaviour logprobs) rows into ids, attention, sources, logprobs."""
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    src = torch.full((len(rows), width), PAD_SOURCE, dtype=torch.uint8)
    blp = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, (t, s, b) in enumerate(rows):
        ids[i, : len(t)], attn[i, : len(t)] = torch.tensor(t), 1
        src[i, : len(t)], blp[i, : len(t)] = torch.tensor(s, dtype=torch.uint8), torch.tensor(b)
    return ids, attn, src, blp


def loss_batch(step: int, rank: int, trajs: list[list[Trajectory]], rewards: torch.Tensor,
               adv: GroupAdvantages, eps: float,
               pad_id: int = EOS) -> tuple[tuple[torch.Tensor, ...], list[float], StepEvidence]:
    """The step's loss rows (the retained groups' trajectories) collated as (ids, attention, loss mask,
    behaviour logprobs), their advantages, and the audit's evidence of what the loss saw."""
    rows, row_adv, row_ids, seen = [], [], [], []
    for gi, ts in enumerate(trajs):
        keep = bool(adv.retained[gi])
        for j, t in enumerate(ts):
            tid = f"s{step}/r{rank}/g{gi}/t{j}"
            seen.append(TrajectoryEvidence(tid, gi, t.item, t.template, len(t.tokens), tuple(t.turns),
                                           float(rewards[gi, j])))
            if keep:
                rows.append((t.tokens, t.sources, t.behaviour_logprobs))
                row_adv.append(float(adv.advantages[gi, j]))
                row_ids.append(tid)
    row_trajectories: list[str | None] = list(row_ids)
    if not rows:  # this rank kept no group: a zero-mask row keeps the ranks' passes paired
        t = trajs[0][0]
        rows, row_adv, row_trajectories = [(t.tokens, [0] * len(t.tokens), [0.0] * len(t.tokens))], [0.0], [None]
    ids, attn, src, blp = collate(rows, pad_id)
    mask = src[:, 1:] == GENERATED
    evidence = StepEvidence(step, seen, ids[:, 1:], mask, torch.tensor(row_adv), row_trajectories, eps)
    return (ids, attn, mask, blp), row_adv, evidence


def agreed_plan(lengths: list[int], budget: int, max_rows: int, device: torch.device) -> list[Pass]:
    """This rank's rows (`lengths`) packed into the fewest passes that fit `budget` and `max_rows`
    (train/passes.py), then filler passes up to the most any rank needs (collective: one all-reduce),
    so every rank runs as many passes (ZeRO's collectives pair them)."""
    mine = plan(lengths, budget, max_rows)
    most = torch.tensor([len(mine)], device=device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return pad_to(mine, int(most))


def step_signal(mask: torch.Tensor, aux_examples: int, device: torch.device) -> tuple[int, int]:
    """(loss tokens, auxiliary examples) of the whole step, every rank's (collective: one all-reduce,
    beside the pass plan's): the count the step's token mean divides by, and whether the step has
    any signal at all (none on any rank: the update skips the optimizer)."""
    counts = torch.tensor([float(mask.sum()), float(aux_examples)], dtype=torch.float64, device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return int(counts[0]), int(counts[1])


def pass_inputs(ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor,
                p: Pass) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of the rank's collated rows (train/passes.py): (row indices, ids, attention, loss mask),
    its rows cut to the pass's own width (right padding: no real token is cut, and a causal model's
    log-probs of a row do not depend on padding after it). A filler pass (no rows) is a 2-token slice
    of the first row with an empty mask: it runs the model so ZeRO's collectives pair with the ranks
    that have more passes, and adds nothing to the loss."""
    if not p.rows:
        return torch.zeros(1, dtype=torch.long, device=ids.device), ids[:1, :2], attn[:1, :2], torch.zeros_like(
            mask[:1, :1])
    rows = torch.tensor(p.rows, dtype=torch.long, device=ids.device)
    return rows, ids[rows, : p.width], attn[rows, : p.width], mask[rows, : p.width - 1]
