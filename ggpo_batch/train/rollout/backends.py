"""The rollout backend a training config names (`train.rollout`): torch here, vLLM only when asked
for, so neither backend module imports the other."""

from __future__ import annotations

import torch

from ..task.codec import Codec
from .sampler import RolloutBackend, TorchSampler


def make_backend(kind: str, model: torch.nn.Module, codec: Codec, **vllm_options: object) -> RolloutBackend:
    """The configured backend over `model`, the behaviour copy (vLLM serves the checkpoint directory, or
    a saved copy of the built-in model), speaking `codec`'s protocol."""
    if kind == "torch":
        return TorchSampler(model, codec)
    from .vllm_backend import VllmBackend  # vllm is imported only by runs that use it

    return VllmBackend(model, codec, **vllm_options)  # type: ignore[arg-type]
