"""How a rank's loss rows go through its forward/backward passes: the token budget of a pass and the
packing of rows into as few passes as fit it. Pure Python (no torch): preflight's memory check reads
the same budget the trainer packs to.

A pass holds at most `train.micro_batch_size` rows (0: no bound) and at most `max_tokens_per_pass`
padded tokens: each row of a pass is padded to the pass's own longest row, so a pass costs
rows x its longest row. Rows are sorted longest first and each pass is a run of consecutive rows
(similar lengths: little padding): first the fewest passes there can be (each pass taking as many
rows as fit), then, with that many, the runs with the least padding (a small dynamic program).
Fewest passes first: a pass has a fixed cost beside its tokens (on a GPU each one reduces the whole
gradients). A row longer than the budget still goes, alone, in a pass of its own: rows are never cut.

The number of passes a step runs is the most any rank needs (trainer.py agrees on it with one
collective); a rank with fewer runs filler passes (`FILLER`) so ZeRO's collectives pair up.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import TrainConfig


@dataclass(frozen=True)
class Pass:
    """One forward/backward pass: the indices of its rows in the rank's batch (longest first) and the
    width (tokens) each is padded to. No rows: a filler pass (an empty loss mask)."""

    rows: tuple[int, ...]
    width: int

    @property
    def padded_tokens(self) -> int:
        return len(self.rows) * self.width


FILLER = Pass((), 0)


def rows_per_pass(cfg: TrainConfig, ranks: int) -> int:
    """Trajectories one forward/backward pass holds at most: train.micro_batch_size, else the rank's
    whole batch, (prompts_per_step / ranks) x group_size."""
    return cfg.micro_batch_size or max(1, cfg.prompts_per_step // ranks) * cfg.group_size


def token_budget(cfg: TrainConfig, ranks: int) -> int:
    """Padded tokens one pass may hold: train.max_tokens_per_pass, else (0) what the memory formula
    (ggpo_batch/train/policy/gpu_memory.py, checked by preflight) is evaluated at: rows_per_pass x max_model_len,
    so packing never puts more tokens in a pass than the check allowed for."""
    return cfg.max_tokens_per_pass or rows_per_pass(cfg, ranks) * cfg.max_model_len


def pass_tokens(cfg: TrainConfig, ranks: int, seq_len: int | None = None) -> int:
    """The most tokens one pass can hold (what memory grows with): the budget, but never more than
    rows_per_pass rows of `seq_len` (default max_model_len) tokens, nor less than one such row (a
    row longer than the budget goes alone in its pass)."""
    seq_len = seq_len or cfg.max_model_len
    rows = rows_per_pass(cfg, ranks)
    budget = cfg.max_tokens_per_pass or rows * seq_len
    return min(rows * seq_len, max(budget, seq_len))


def plan(lengths: Sequence[int], budget: int, max_rows: int = 0) -> list[Pass]:
    """The fewest passes of rows of these `lengths` (tokens, by row index) that each hold at most
    `budget` padded tokens and `max_rows` rows (0: any number), and among those the least padding:
    rows longest first (ties by index, so every rank and rerun packs alike), each pass a run of
    consecutive rows of that order. No rows: no passes."""
    if budget < 1 or max_rows < 0:
        raise ValueError(f"budget must be >= 1 and max_rows >= 0, got {budget} and {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    sizes = [lengths[i] for i in order]
    fewest = _greedy_count(sizes, budget, max_rows)
    cuts = _least_padding(sizes, budget, max_rows, fewest)
    return [Pass(tuple(order[a:b]), sizes[a]) for a, b in itertools.pairwise(cuts)]


def _fits(count: int, width: int, budget: int, max_rows: int) -> bool:
    """Can `count` rows, the longest `width` tokens, share one pass? (One row always goes.)"""
    return (count == 1 or count * width <= budget) and (not max_rows or count <= max_rows)


def _greedy_count(sizes: list[int], budget: int, max_rows: int) -> int:
    """Passes when each takes as many of the next rows (longest first) as fit: the fewest there are,
    since a pass taking a row later never makes a later pass wider."""
    count = at = 0
    while at < len(sizes):
        take = 1
        while at + take < len(sizes) and _fits(take + 1, sizes[at], budget, max_rows):
            take += 1
        count, at = count + 1, at + take
    return count


def _least_padding(sizes: list[int], budget: int, max_rows: int, passes: int) -> list[int]:
    """Cut points 0 = c0 < c1 < ... < c_passes = len(sizes) of the runs of `sizes` (longest first) into
    exactly `passes` passes that fit, with the fewest padded tokens (the sum of run length x its
    first size): dynamic programming over (rows covered, passes used); ties go to the longer first
    runs, so the result does not depend on anything but the lengths."""
    n, inf = len(sizes), float("inf")
    best = [[inf] * (passes + 1) for _ in range(n + 1)]
    back = [[0] * (passes + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for end in range(1, n + 1):
        for start in range(end - 1, -1, -1):  # a longer run, and a wider one: once it fails, all longer fail
            if not _fits(end - start, sizes[start], budget, max_rows):
                break
            cost = (end - start) * sizes[start]
            for used in range(1, passes + 1):
                if best[start][used - 1] + cost < best[end][used]:
                    best[end][used], back[end][used] = best[start][used - 1] + cost, start
    cuts, end = [n], n
    for used in range(passes, 0, -1):
        end = back[end][used]
        cuts.append(end)
    return cuts[::-1]


def pad_to(passes: list[Pass], count: int) -> list[Pass]:
    """`passes` followed by filler passes up to `count` (the step's agreed number)."""
    if count < len(passes):
        raise ValueError(f"{len(passes)} passes cannot be padded to {count}")
    return passes + [FILLER] * (count - len(passes))
