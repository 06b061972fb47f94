"""Packed passes (ggpo_batch/train/passes.py): the planner packs a rank's rows, longest first, into the
fewest passes that fit the token budget and micro_batch_size; the passes' loss and gradients equal one
pass over the same rows; ranks with different row counts agree on the step's number of passes."""

from __future__ import annotations

import itertools

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.passes import (
    FILLER,
    Pass,
    pad_to,
    pass_tokens,
    plan,
    token_budget,
)


def fewest_passes(lengths: list[int], budget: int, max_rows: int) -> int:
    """Brute force: the fewest groups of rows, each within the budget (rows x its longest) and max_rows."""
    n = len(lengths)
    for k in range(1, n + 1):
        for labels in itertools.product(range(k), repeat=n):
            groups = [[lengths[i] for i in range(n) if labels[i] == g] for g in range(k)]
            if all(g and (len(g) * max(g) <= budget or len(g) == 1) and (not max_rows or len(g) <= max_rows)
                   for g in groups):
                return k
    return n


def test_the_plan_packs_longest_first_each_pass_padded_to_its_own_longest_row() -> None:
    lengths = [10, 40, 12, 38, 11, 90]
    passes = plan(lengths, budget=100)
    assert passes == [Pass((5,), 90), Pass((1, 3), 40), Pass((2, 4, 0), 12)]
    assert sorted(i for p in passes for i in p.rows) == list(range(len(lengths)))  # every row once
    assert all(p.padded_tokens <= 100 for p in passes)
    assert sum(p.padded_tokens for p in passes) == 90 + 80 + 36  # vs 6 x 90 = 540 padded to the batch's longest
    # micro_batch_size bounds the rows of a pass; a row longer than the budget goes alone.
    assert [p.rows for p in plan(lengths, budget=100, max_rows=2)] == [(5,), (1, 3), (2, 4), (0,)]
    assert plan(lengths, budget=50)[0] == Pass((5,), 90)
    assert plan([], budget=10) == []
    assert plan([7, 7, 7], budget=7, max_rows=0) == [Pass((0,), 7), Pass((1,), 7), Pass((2,), 7)]
    with pytest.raises(ValueError):
        plan([3], budget=0)


@pytest.mark.parametrize("seed", range(30))
def test_no_partition_of_the_rows_needs_fewer_passes(seed: int) -> None:
    import random

    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(5, 20), rng.randint(20, 200)]) for _ in range(rng.randint(1, 6))]
    budget, max_rows = rng.randint(20, 400), rng.choice([0, 0, 1, 2, 3])
    passes = plan(lengths, budget, max_rows)
    assert len(passes) == fewest_passes(lengths, budget, max_rows), (lengths, budget, max_rows)
    for p in passes:
        assert p.width == max(lengths[i] for i in p.rows)
        assert len(p.rows) == 1 or p.padded_tokens <= budget
        assert not max_rows or len(p.rows) <= max_rows


def test_filler_passes_pad_a_rank_to_the_agreed_count() -> None:
    mine = plan([5, 3], budget=5)
    assert pad_to(mine, 4) == [*mine, FILLER, FILLER] and FILLER.rows == () and FILLER.padded_tokens == 0
    with pytest.raises(ValueError):
        pad_to(mine, 1)


def test_the_budget_key_defaults_to_what_the_memory_estimate_is_checked_at() -> None:
    cfg = TrainConfig.from_table({"prompts_per_step": 4, "group_size": 4}, "t")
    assert cfg.max_tokens_per_pass == 0
    assert token_budget(cfg, ranks=2) == 8 * cfg.max_model_len  # the rank's 8 rows of max_model_len
    assert pass_tokens(cfg, ranks=2) == 8 * cfg.max_model_len
    one = TrainConfig.from_table({"micro_batch_size": 1, "max_tokens_per_pass": 900}, "t")
    assert token_budget(one, ranks=1) == 900
    assert pass_tokens(one, ranks=1) == one.max_model_len  # one row a pass: never more than a row's tokens
    small = TrainConfig.from_table({"max_tokens_per_pass": 10}, "t")
    assert pass_tokens(small, ranks=1) == small.max_model_len  # nor less than one row (it goes alone)
    with pytest.raises(SpecError, match="max_tokens_per_pass"):
        TrainConfig.from_table({"max_tokens_per_pass": -1}, "t")
