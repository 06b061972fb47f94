"""One step's loss batch, as pure functions of the step's trajectories: the rows the loss sees
(retained groups only), their collation, the audit's evidence of them, and how many micro-batch
passes a step takes; plus the loop state a resumed job restores. No DeepSpeed here, so a test can
build a batch without an engine."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .audit import StepEvidence, TrajectoryEvidence
from .config import TrainConfig
from .environment import GENERATED, PAD_SOURCE, Trajectory
from .tokenizer import EOS

if TYPE_CHECKING:
    from .ggpo import GroupAdvantages


@dataclass
class LoopState:
    """Everything a resumed job needs to continue the loop exactly where it stopped (per rank)."""

    step: int = 0
    loop_seconds: float = 0.0
    last_batch_seconds: float = 0.0
    tally: Counter = field(default_factory=Counter)  # local counts, costs and aux sources
    templates: Counter = field(default_factory=Counter)
    aux_seen: set = field(default_factory=set)
    history: list = field(default_factory=list)
    exposed_items: set = field(default_factory=set)  # ids of items this rank trained in an exposure group


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


def micro_batches(cfg: TrainConfig, world: int) -> int:
    """Forward/backward passes per step on every rank: 1 (the whole local batch at once) when
    train.micro_batch_size is 0, else enough passes of that many rows for the most rows a rank can
    hold, (prompts_per_step / world) x group_size."""
    if not cfg.micro_batch_size:
        return 1
    capacity = max(1, cfg.prompts_per_step // world) * cfg.group_size
    return -(-capacity // cfg.micro_batch_size)
