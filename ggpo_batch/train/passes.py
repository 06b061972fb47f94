"""How a rank's loss rows go through its forward/backward passes: the token budget of a pass and the
packing of rows into as few passes as fit it. Pure Python (no torch): preflight's memory check reads
the same budget the trainer packs to.

A pass holds at most `train.micro_batch_size` rows (0: no bound) and at most `max_tokens_per_pass`
padded tokens: each row of a pass is padded to the pass's own longest row, so a pass costs
rows x its longest row. Rows go in longest first, each pass taking the next rows while they fit:
consecutive rows of the sorted order have similar lengths (little padding), and since every pass
takes as many rows as fit, no partition of the rows needs fewer passes (taking a row later never
lowers a pass's width, so a greedy pass is never worse than any other choice). A row longer than the
budget still goes, alone, in a pass of its own: rows are never cut.

The number of passes a step runs is the most any rank needs (trainer.py agrees on it with one
collective); a rank with fewer runs filler passes (`FILLER`) so ZeRO's collectives pair up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import TrainConfig


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
    (ggpo_batch/gpu_memory.py, checked by preflight) is evaluated at: rows_per_pass x max_model_len,
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
    `budget` padded tokens and `max_rows` rows (0: any number), longest rows first (ties by index,
    so every rank and rerun packs alike). No rows: no passes."""
    if budget < 1 or max_rows < 0:
        raise ValueError(f"budget must be >= 1 and max_rows >= 0, got {budget} and {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    passes: list[Pass] = []
    at = 0
    while at < len(order):
        width = lengths[order[at]]  # the pass's longest row: the first, in this order
        take = max(1, budget // width) if width else len(order) - at
        if max_rows:
            take = min(take, max_rows)
        passes.append(Pass(tuple(order[at:at + take]), width))
        at += take
    return passes


def pad_to(passes: list[Pass], count: int) -> list[Pass]:
    """`passes` followed by filler passes up to `count` (the step's agreed number)."""
    if count < len(passes):
        raise ValueError(f"{len(passes)} passes cannot be padded to {count}")
    return passes + [FILLER] * (count - len(passes))
