"""The auxiliary answer loss of the `*_answer` arms: supervised targets for exposed items whose gold
answer a retrieved passage states, and their negative log-likelihood on the policy, beside the ggpo loss.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..rollout.environment import GENERATED, Trajectory
from ..task.qa import is_clean_answer, normalize
from .batch import collate
from .logprobs import masked_logprobs

if TYPE_CHECKING:
    from ..audit.checkpoint import LoopState
    from ..task.codec import Codec
    from ..task.curriculum import GroupSpec


def answer_examples(state: LoopState, retriever: Any, codec: Codec, top_k: int, groups: list[GroupSpec],
                    trajs: list[list[Trajectory]]) -> list[tuple[list[int], int]]:
    """Supervised (tokens, answer_start) targets for exposed items whose gold answer is verified."""
    tally, out = state.tally, []
    for g, ts in zip(groups, trajs):
        if not g.exposure:
            continue
        seen_titles = {title for t in ts for title in t.retrieved_titles}
        for item, tmpl in g.parts:
            if item.item_id in state.aux_seen:
                continue
            state.aux_seen.add(item.item_id)
            tally["groups_considered"] += 1
            # Verified: a gold answer is stated by a passage BM25 finds for the question.
            found = retriever.search(item.question, top_k)
            verified = [a for a in item.answers if any(normalize(a) in normalize(p.text) for p in found)]
            if not verified:
                tally["skipped_no_verified_target"] += 1
                continue
            prompt, answer = codec.prompt(tmpl, item), codec.answer_target(verified[0])
            out.append((prompt + answer, len(prompt)))
            tally["examples"] += 1
            tally["answer_tokens"] += len(answer)
            tally["gold_checked_clean_answer"] += int(is_clean_answer(verified[0]))
            # Covered: the group's rollouts retrieved every supporting passage (all hops).
            covered = bool(item.support_titles) and set(item.support_titles) <= seen_titles
            tally["training_gold_with_support_title_coverage"] += int(covered)
    return out


def answer_loss(engine: Any, codec: Codec, chunks: Any, device: torch.device, tally: Counter,
                examples: list[tuple[list[int], int]]) -> torch.Tensor | None:
    """The auxiliary answer loss of `examples` on this rank; collective (every rank runs the same number
    of rows, padded with zero-loss rows), None when no rank has a target."""
    n_max = torch.tensor([len(examples)], device=device)
    dist.all_reduce(n_max, op=dist.ReduceOp.MAX)
    if int(n_max) == 0:  # no rank has a target: no rank runs the forward (ZeRO-3 needs them paired)
        return None
    # Zero-loss DP padding: every rank runs the same number of aux rows.
    rows = [(t, [GENERATED if i >= a else 0 for i in range(len(t))], [0.0] * len(t)) for t, a in examples]
    pad = ([codec.pad_id] * 7, [0] * 7, [0.0] * 7)
    rows += [pad] * (int(n_max) - len(examples))
    ids, attn, src, _ = collate(rows, codec.pad_id)
    ids, attn = ids.to(device), attn.to(device)
    mask = (src[:, 1:] == GENERATED).to(device)
    tally["aux_sequence_nonpadding_tokens_including_dp_padding"] += int(attn.sum())
    tally["aux_sequence_padded_tokens"] += ids.numel()
    tally["aux_loss_tokens"] += int(mask.sum())
    nll = -masked_logprobs(engine, engine.module, ids, attn, mask, 1.0, codec, chunks)
    return nll.sum() / mask.sum().clamp(min=1)
