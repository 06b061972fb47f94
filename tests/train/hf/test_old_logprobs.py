"""`[train] old_logprobs = "policy"` without a forward of its own (issue 39): the old log-probs are the
update's own forward, detached (train/run/trainer.py `_old_logprobs`), where the code before took them
from a no-grad forward of every pass. One optimizer step per batch makes the two the same numbers: one
step of the tiny checkpoint (float32, one gloo rank, ZeRO-2) gives the same loss, gradient norm and
updated weights either way (to 1e-6), with gradient checkpointing and chunked log-probs over packed
multi-row passes, and without either one row a pass; the old path (tools/bench/update_phase.py
`recompute_old_logprobs`) runs one more policy forward a pass. A planted defect (old log-probs off by
1e-3, as a kernel mismatch would leave them) fails the same comparison."""

from __future__ import annotations

import dataclasses
import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = pytest.mark.train

from ggpo_batch.train.config import TrainConfig
from tools.bench.update_phase import count_forwards, recompute_old_logprobs

LENGTHS = (40, 33, 27, 21, 12)  # the rows (tokens) of the step
ADVANTAGES = [1.3, -0.7, 0.4, -1.1, 0.9]
TOLERANCE = 1e-6
SHAPES = {
    # Checkpointing on, chunks smaller than a pass's targets and the vocabulary, rows packed
    # several to a pass (at most 80 padded tokens): 3 passes, 2 of them multi-row.
    "checkpointing, chunked, packed": {"gradient_checkpointing": True, "logprob_chunk_tokens": 16,
                                       "logprob_chunk_vocab": 128, "max_tokens_per_pass": 80},
    # Neither: full logits, one row a pass.
    "full logits, one row a pass": {"logprob_chunk_tokens": 0, "micro_batch_size": 1},
}


def rows_of(codec, vocab: int, seed: int = 3):  # type: ignore[no-untyped-def]
    """(tokens, sources, behaviour log-probs): a prompt, then generated tokens with tool output between;
    no token the environment alone writes (impossible for the policy) where the policy generated."""
    from ggpo_batch.train.rollout.environment import GENERATED, PROMPT, TOOL

    rng, banned = random.Random(seed), set(codec.env_only_ids)
    allowed = [i for i in range(vocab) if i not in banned]
    rows = []
    for n in LENGTHS:
        src = [PROMPT] * 8 + [rng.choice([GENERATED, GENERATED, TOOL]) for _ in range(n - 8)]
        rows.append(([rng.choice(allowed) for _ in range(n)], src, [0.0] * n))
    return rows


def one_step(hf_spec, train: dict, variant=None):  # type: ignore[no-untyped-def]
    """One `_update` of a fresh trainer (the same weights every time) on the same rows: (loss, gradient
    norm, updated weights, the weights' largest move, forwards counted, passes)."""
    from ggpo_batch.train.policy.batch import collate
    from ggpo_batch.train.policy.step_figures import StepFigures
    from ggpo_batch.train.rollout.environment import GENERATED
    from ggpo_batch.train.run.trainer import Trainer

    train = dict(train)
    checkpointing = train.pop("gradient_checkpointing", False)
    spec = hf_spec("clean", budget=1e9, **train)
    model = {**spec.train["model"], "gradient_checkpointing": checkpointing}
    spec = dataclasses.replace(spec, train={**spec.train, "model": model})
    trainer = Trainer(spec, TrainConfig.from_table(spec.train, "t"), rank=0, world=1, device=torch.device("cpu"),
                      budget_seconds=1e9)
    try:
        if variant is not None:
            variant(trainer)
        ids, attn, src, blp = collate(rows_of(trainer.codec, trainer.engine.module.config.vocab_size),
                                      trainer.codec.pad_id)
        batch = ids, attn, src[:, 1:] == GENERATED, blp
        before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
        forwards, figures, plan = count_forwards(trainer), StepFigures(), trainer._plan(attn)
        trainer._update(batch, ADVANTAGES, [], figures, plan)
        after = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
        moved = max(float((after[n] - before[n]).abs().max()) for n in before)
        return figures.loss, figures.gradient_norm, after, moved, dict(forwards), plan
    finally:
        trainer.close()


def worst(a: tuple, b: tuple) -> float:  # type: ignore[type-arg]
    """The largest difference of loss, gradient norm or any updated weight of two steps."""
    return max(abs(a[0] - b[0]), abs(a[1] - b[1]), *(float((a[2][n] - b[2][n]).abs().max()) for n in a[2]))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_updates_own_forward_gives_the_recomputed_step_without_its_forward(one_rank, hf_spec, shape):  # type: ignore[no-untyped-def]
    train = SHAPES[shape]
    new = one_step(hf_spec, train)
    old = one_step(hf_spec, train, recompute_old_logprobs)
    plan = new[5]
    assert len(plan) > 1 and plan == old[5]
    assert (len(plan) == 3 and sum(len(p.rows) > 1 for p in plan) == 2) if "packed" in shape else \
        all(len(p.rows) == 1 for p in plan)
    assert new[3] > 1e-4 and new[1] > 1e-3  # the step moved the weights far past the tolerance
    assert worst(new, old) < TOLERANCE, (new[:2], old[:2])
    # One policy forward a pass, with grad; the old path one more, without.
    assert new[4] == {"policy with grad": len(plan), "reference": len(plan)}
    assert old[4] == {"policy with grad": len(plan), "policy": len(plan), "reference": len(plan)}
    if "packed" in shape:  # the check catches a step that differs: old log-probs off by 1e-3 (a ratio of 1.001)
        defect = one_step(hf_spec, train, lambda t: setattr(t, "_old_logprobs", lambda logp: logp.detach() - 1e-3))
        assert worst(defect, old) > 100 * TOLERANCE
