"""One real training step of the tiny checkpoint on one gloo rank: the memory order around the update
(train/memory_order.py) as the step really calls it, and the policy's "old" log-probs
(`[train] old_logprobs = "policy"`): the update's own, detached, against the plain full-logits path."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # a DeepSpeed engine and real rollouts: ~10 s each

from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.rollout.sampler import TorchSampler
from tests.support.memory_calls import RecordsMemoryCalls


class Recording(RecordsMemoryCalls, TorchSampler):
    """The torch sampler over a behaviour copy, writing down every call the step makes."""

    def __init__(self, model, codec, calls):  # type: ignore[no-untyped-def]
        super().__init__(model, codec)
        self.calls = calls

    def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append("generate")
        return super().generate(*args, **kwargs)

    def sync_weights(self, weights):  # type: ignore[no-untyped-def]
        self.calls.append("load")
        return super().sync_weights(weights)

    def prompt_logprobs(self, tokens):  # type: ignore[no-untyped-def]
        self.calls.append("probe")
        return super().prompt_logprobs(tokens)


def make_trainer(hf_spec, **train):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.run.trainer import Trainer

    spec = hf_spec("clean", budget=1e9, **train)
    cfg = TrainConfig.from_table(spec.train, "t")
    return Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)


def test_a_step_sleeps_trains_frees_wakes_weights_pushes_wakes_kv_in_that_order(one_rank, hf_spec):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.run.weight_sync import WeightSync, probe_sequence

    trainer = make_trainer(hf_spec)
    calls: list[str] = []
    try:
        trainer.backend = Recording(copy.deepcopy(trainer.engine.module).eval(), trainer.codec, calls)
        trainer.weight_sync = WeightSync(trainer.engine.module, 2, trainer.backend,
                                         probe_sequence(trainer.codec, trainer.data.train[:8]), "float32",
                                         torch.device("cpu"))
        trainer.free_cache = lambda: calls.append("free_cache")
        step = trainer.engine.step
        trainer.engine.step = lambda *a, **k: (calls.append("optimizer"), step(*a, **k))[1]
        calls.clear()  # the baseline probe at construction
        trainer.step()
    finally:
        trainer.close()
    last_rollout = max(i for i, c in enumerate(calls) if c == "generate")
    tail = calls[last_rollout + 1:]
    after = [c for i, c in enumerate(tail) if i == 0 or c != tail[i - 1]]  # one "optimizer" per run of passes
    assert after[:2] == ["sleep", "optimizer"], calls  # asleep before any training
    assert after[2:] == ["free_cache", "wake_weights", "load", "wake_kv_cache", "probe"], calls
    assert trainer.state.history[-1]["weight_sync_probe"]["passed"]


def test_the_old_logprobs_are_the_policys_and_the_step_records_its_health(one_rank, hf_spec):  # type: ignore[no-untyped-def]
    """old_logprobs = "policy" (the default): the update's own forward of each pass, detached (no forward
    of their own: tests/train/hf/test_old_logprobs.py), are the policy's log-probs, those of the plain
    full-logits path; so the PPO ratio is 1 and nothing is clipped; the step's history carries the
    health figures."""
    from ggpo_batch.train.policy.batch import loss_batch
    from ggpo_batch.train.policy.ggpo import group_advantages
    from ggpo_batch.train.policy.model import logprobs_of

    trainer = make_trainer(hf_spec, micro_batch_size=3)
    assert trainer.cfg.old_logprobs == "policy"
    try:
        trajs = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
        rewards = torch.tensor([[t.reward for t in ts] for ts in trajs])
        (ids, attn, mask, _), _, _ = loss_batch(0, 0, trajs, rewards, group_advantages(rewards), 1e-6,
                                                trainer.codec.pad_id)
        plan = trainer._plan(attn)
        passes = list(trainer._passes(ids, attn, mask, plan))
        assert len(passes) == len(plan) > 1
        for _, part_ids, part_attn, m in passes:
            live = trainer._policy_logprobs(part_ids, part_attn, m)  # what the update's forward computes
            old = trainer._old_logprobs(live)
            assert live.requires_grad and not old.requires_grad and torch.equal(old, live.detach())
            with torch.no_grad():
                full = logprobs_of(trainer.engine.module, part_ids, part_attn, trainer.cfg.temperature, trainer.codec)
            assert torch.allclose(old[m], full[m], atol=1e-5)
            assert bool((old[~m] == 0).all())
        trainer.step()
        h = trainer.state.history[-1]
        assert h["clip_fraction"] == 0.0 and h["kl"] >= 0.0
        assert 0.0 <= h["logprob_gap_mean"] <= h["logprob_gap_p99"] < 1e-4  # the torch sampler is the policy
        assert h["is_weight_mean"] is None and h["is_truncated_fraction"] is None
        assert 0.0 <= h["mean_reward"] <= 1.0 and h["weight_sync_probe"] is None  # nothing pushed
    finally:
        trainer.close()
