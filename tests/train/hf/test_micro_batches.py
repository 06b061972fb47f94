"""`train.micro_batch_size` and `max_tokens_per_pass`: the rank's rows in several forward/backward passes
whose gradients DeepSpeed accumulates give the same update as one pass, also with gradient checkpointing and
chunked log-probs together; the renamed key is refused with its new name."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train]

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import full_state_dict
from ggpo_batch.train.policy.passes import plan


def updated_weights(hf_spec, fixed, checkpointing: bool = False, **train):  # type: ignore[no-untyped-def]
    """One ggpo update of the tiny checkpoint on the rollouts `fixed` (None: roll out and keep them)."""
    import dataclasses

    from ggpo_batch.train.run.trainer import Trainer

    spec = hf_spec("clean", budget=1e9, **train)
    model = {**spec.train["model"], "gradient_checkpointing": checkpointing}
    spec = dataclasses.replace(spec, train={**spec.train, "model": model})
    cfg = TrainConfig.from_table(spec.train, "t")
    trainer = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    try:
        assert trainer.engine.module.is_gradient_checkpointing == checkpointing
        before = full_state_dict(trainer.engine.module, cfg.zero_stage)
        if fixed is None:
            fixed = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
        trainer._rollouts = lambda groups, step: copy.deepcopy(fixed)
        trainer.step()
        after = full_state_dict(trainer.engine.module, cfg.zero_stage)
        return before, after, trainer.state.history[0]["passes"], fixed, trainer.state.history[0]
    finally:
        trainer.close()


def test_micro_batches_with_checkpointing_and_chunks_give_the_one_pass_update(one_rank, hf_spec):  # type: ignore[no-untyped-def]
    before, whole, passes, fixed, h1 = updated_weights(hf_spec, None, logprob_chunk_tokens=0)
    assert passes == 1
    assert sum(t.reward != ts[0].reward for ts in fixed for t in ts) > 0  # some group carries a signal
    step = torch.cat([(whole[k] - before[k]).flatten() for k in whole])
    assert float(step.norm()) > 1e-2  # the update is far larger than the tolerances below
    for train in ({"micro_batch_size": 3, "logprob_chunk_tokens": 0},
                  {"micro_batch_size": 5, "logprob_chunk_tokens": 7, "logprob_chunk_vocab": 100, "checkpointing": True}):
        _, split, passes, _, h = updated_weights(hf_spec, fixed, **train)
        # The rows of the retained groups (of 4 prompts x 4 rollouts on one rank), micro_batch_size a pass.
        rows = sum(len(ts) for ts in fixed if len({t.reward for t in ts}) > 1)
        assert passes == -(-rows // train["micro_batch_size"]) > 1
        check_equal(h, h1, split, whole, step, train)
    # Packed to a token budget, no row bound: rows of different lengths share passes, each pass padded
    # to its own longest row.
    lengths = [len(t.tokens) for ts in fixed if len({t.reward for t in ts}) > 1 for t in ts]
    budget = 2 * max(lengths) + 1
    _, packed, passes, _, h = updated_weights(hf_spec, fixed, max_tokens_per_pass=budget, logprob_chunk_tokens=0)
    assert passes == len(plan(lengths, budget)) > 1 and passes < len(lengths)
    assert h["passes_nonpadding_tokens"] == sum(lengths) <= h["passes_padded_tokens"] < len(lengths) * max(lengths)
    check_equal(h, h1, packed, whole, step, {"max_tokens_per_pass": budget})


def check_equal(h, h1, split, whole, step, train) -> None:  # type: ignore[no-untyped-def]
    # The loss and the accumulated gradient's norm (before clipping) to 1e-6; the weights after
    # AdamW, whose first step divides each gradient by its own magnitude (float32 summation order
    # moves the tiniest gradients' updates by a few 1e-3 of lr), to 1e-4 of the update's norm.
    assert h["loss"] == pytest.approx(h1["loss"], abs=1e-6)
    assert h["gradient_norm"] == pytest.approx(h1["gradient_norm"], rel=1e-6)
    diff = torch.cat([(split[k] - whole[k]).flatten() for k in whole])
    assert float(diff.norm()) < 1e-4 * float(step.norm()), (train, float(diff.norm()), float(step.norm()))


def test_the_old_key_is_refused_with_the_new_name() -> None:
    with pytest.raises(SpecError) as e:
        TrainConfig.from_table({"micro_batch_rows": 2}, "jobs/x.toml")
    assert "train.micro_batch_rows" in str(e.value) and "micro_batch_size = 2" in str(e.value)
    assert TrainConfig.from_table({"micro_batch_size": 2}, "jobs/x.toml").micro_batch_size == 2
    with pytest.raises(SpecError, match="logprob_chunk_vocab"):
        TrainConfig.from_table({"logprob_chunk_vocab": 0}, "jobs/x.toml")
