"""Packed passes (ggpo_batch/train/policy/passes.py): the planner packs a rank's rows, longest first, into the
fewest passes that fit the token budget and micro_batch_size; the passes' loss and gradients equal one
pass over the same rows; ranks with different row counts agree on the step's number of passes."""

from __future__ import annotations

import itertools

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.passes import FILLER, Pass, pad_to, pass_tokens, plan, token_budget


def fewest_passes(lengths: list[int], budget: int, max_rows: int) -> tuple[int, int]:
    """Brute force over every partition of the rows: (the fewest groups each within the budget (rows x
    its longest) and max_rows, the fewest padded tokens of so many groups)."""
    n = len(lengths)
    for k in range(1, n + 1):
        padded = []
        for labels in itertools.product(range(k), repeat=n):
            groups = [[lengths[i] for i in range(n) if labels[i] == g] for g in range(k)]
            if all(g and (len(g) * max(g) <= budget or len(g) == 1) and (not max_rows or len(g) <= max_rows)
                   for g in groups):
                padded.append(sum(len(g) * max(g) for g in groups))
        if padded:
            return k, min(padded)
    raise AssertionError("one row a group always fits")


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


@pytest.mark.parametrize("seed", range(60))
def test_no_partition_of_the_rows_needs_fewer_passes_or_pads_less_with_as_few(seed: int) -> None:
    import random

    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(5, 20), rng.randint(20, 200)]) for _ in range(rng.randint(1, 6))]
    budget, max_rows = rng.randint(20, 400), rng.choice([0, 0, 1, 2, 3])
    passes = plan(lengths, budget, max_rows)
    assert (len(passes), sum(p.padded_tokens for p in passes)) == fewest_passes(lengths, budget, max_rows), (
        lengths, budget, max_rows)
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


def rows_of(lengths: list[int], seed: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(tokens, sources, behaviour log-probs) rows like a multi-turn trajectory's: a prompt, then turns of
    generated tokens with tool output between them."""
    import random

    from ggpo_batch.train.rollout.environment import GENERATED, PROMPT, TOOL

    rng = random.Random(seed)
    rows = []
    for n in lengths:
        prompt = min(8, n - 2)
        src = [PROMPT] * prompt + [rng.choice([GENERATED, GENERATED, TOOL]) for _ in range(n - prompt)]
        rows.append(([rng.randrange(1, 250) for _ in range(n)], src, [0.0] * n))
    return rows


def packed_loss_and_gradients(policy, reference, batch, adv, passes, chunks,  # type: ignore[no-untyped-def]
                              *, share: bool = True):
    """The trainer's per-pass loss (ggpo on the pass's rows, times its tokens' share of the rank's token
    mean), backward pass by pass: (the summed loss, every parameter's accumulated gradient)."""
    import torch

    from ggpo_batch.train.ggpo_config import GgpoConfig
    from ggpo_batch.train.policy.batch import pass_inputs
    from ggpo_batch.train.policy.ggpo import ggpo_loss
    from ggpo_batch.train.policy.logprobs import masked_logprobs

    ids, attn, mask = batch
    total = mask.sum().clamp(min=1)
    policy.zero_grad()
    loss = 0.0
    for p in passes:
        rows, part_ids, part_attn, m = pass_inputs(ids, attn, mask, p)
        logp = masked_logprobs(policy, policy, part_ids, part_attn, m, 1.0, None, chunks)
        with torch.no_grad():
            ref = masked_logprobs(reference, reference, part_ids, part_attn, m, 1.0, None, chunks)
        # "Old" log-probs a little off the policy's, so the ratio clips somewhere.
        part, _ = ggpo_loss(logp, logp.detach() + 0.3 * torch.sin(ref), ref, adv[rows], m, GgpoConfig(kl_coef=0.1))
        part = part * (m.sum() / total) if share else part
        part.backward()
        loss += float(part.detach())
    return loss, {n: q.grad.detach().clone() for n, q in policy.named_parameters() if q.grad is not None}


@pytest.mark.parametrize("chunk_tokens", [0, 16])
def test_packed_passes_give_the_loss_and_gradients_of_one_pass_over_the_same_rows(chunk_tokens: int) -> None:
    """float32 on the CPU, the built-in GPT-2: rows of lengths varying 5x in passes packed to a budget
    (each pass padded to its own longest row, fillers included) against one pass of every row padded
    to the longest; a pass that forgets its tokens' share of the token mean is caught."""
    import torch

    from ggpo_batch.train.policy.batch import collate
    from ggpo_batch.train.policy.logprobs import Chunks
    from ggpo_batch.train.policy.model import build_model
    from ggpo_batch.train.rollout.environment import GENERATED

    cfg = TrainConfig.from_table({}, "t")
    policy, reference = build_model(cfg, 0).float(), build_model(cfg, 1).float()
    lengths = [70, 14, 33, 61, 15, 12, 40, 22, 18, 66]
    ids, attn, src, _ = collate(rows_of(lengths, 3))
    batch = (ids, attn, src[:, 1:] == GENERATED)
    adv = torch.linspace(-1.5, 1.2, len(lengths))
    chunks = Chunks(chunk_tokens, 64)
    one, g1 = packed_loss_and_gradients(policy, reference, batch, adv, [Pass(tuple(range(len(lengths))), 70)],
                                        chunks)
    passes = pad_to(plan(lengths, budget=140, max_rows=3), 7)
    assert [len(p.rows) for p in passes] == [2, 2, 3, 3, 0, 0, 0]  # 70,66 | 61,40 | 33,22,18 | 15,14,12 | fillers
    assert sum(p.padded_tokens for p in passes) < 0.6 * len(lengths) * 70
    packed, g2 = packed_loss_and_gradients(policy, reference, batch, adv, passes, chunks)
    assert abs(one) > 1e-2 and g1.keys() == g2.keys()
    assert packed == pytest.approx(one, abs=1e-6)
    worst = max(float((g1[k] - g2[k]).abs().max()) for k in g1)
    assert worst < 1e-6, worst
    assert max(float(g.abs().max()) for g in g1.values()) > 1e-3  # far above the tolerance
    unshared, _ = packed_loss_and_gradients(policy, reference, batch, adv, passes, chunks, share=False)
    assert abs(unshared - one) > 1e-3  # the planted defect: each pass's own token mean, summed


def agree_on_rank(rank: int, port: int, folder: str) -> None:
    """One of two gloo ranks: its own rows' lengths, the step's agreed passes written to <folder>/<rank>."""
    import json
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from ggpo_batch.train.policy.batch import agreed_plan

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    lengths = [[30, 12, 50, 9, 41, 22], [20]][rank]
    passes = agreed_plan(lengths, 60, 2, torch.device("cpu"))
    Path(folder, str(rank)).write_text(json.dumps([[list(p.rows), p.width] for p in passes]))
    dist.destroy_process_group()


def test_two_ranks_with_different_row_counts_agree_on_the_passes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    import torch.multiprocessing as mp

    from ggpo_batch.common.netutil import free_port

    mp.spawn(agree_on_rank, args=(free_port(), str(tmp_path)), nprocs=2)
    ranks = [json.loads((tmp_path / str(r)).read_text()) for r in range(2)]
    # Rank 0: 50 | 41 | 30,22 | 12,9 (budget 60, 2 rows a pass); rank 1: its one row, then 3 fillers.
    assert ranks[0] == [[[2], 50], [[4], 41], [[0, 5], 30], [[1, 3], 12]]
    assert ranks[1] == [[[0], 20], [[], 0], [[], 0], [[], 0]]


@pytest.mark.slow
def test_a_two_rank_run_packs_its_passes_and_records_them(tmp_path, spec_for) -> None:  # type: ignore[no-untyped-def]
    """2 CPU ranks, DeepSpeed ZeRO-2, one row a pass: ranks keep different numbers of rows and still
    step together (each step's count is the most a rank needs, the other runs fillers); each pass
    pads its row to its own length, so padded and non-padded tokens are equal."""
    import json
    from pathlib import Path

    from ggpo_batch.contracts.run_record import check_run_record, entry_key
    from ggpo_batch.train.run.launch import train_local

    out = tmp_path / "record.json"
    spec = spec_for("clean", seed=1, budget=1e9, micro_batch_size=1, max_steps=3)  # its step 1 drops a group
    rec = train_local(spec, out, nproc=2, timeout=300)
    details = json.loads(Path(str(out) + ".details.json").read_text())
    assert check_run_record(entry_key(rec["seed"], "clean"), rec) == []
    assert len(set(details["rank_policy_sha256"])) == 1
    history = details["history"]
    assert len(history) == 3
    for h in history:
        assert h["passes"] >= 1 and h["passes_padded_tokens"] == h["passes_nonpadding_tokens"]
    assert any(h["filler_passes"] > 0 for h in history)  # some step's ranks kept different numbers of rows
    cost = rec["training"]["cost"]
    assert cost["rl_sequence_padded_tokens"] == cost["rl_sequence_nonpadding_tokens"] == sum(
        h["passes_nonpadding_tokens"] for h in history) > 0
