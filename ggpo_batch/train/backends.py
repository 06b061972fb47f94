"""The rollout backend a training config names (`train.rollout`): torch here, vLLM only when asked
for, so neither backend module imports the other."""

from __future__ import annotations

import torch

from .rollout import RolloutBackend, TorchSampler


def make_backend(kind: str, model: torch.nn.Module, **vllm_options: object) -> RolloutBackend:
    """The configured backend over `model`, the behaviour copy (vLLM serves a saved copy of it)."""
    if kind == "torch":
        return TorchSampler(model)
    from .vllm_backend import VllmBackend  # vllm is imported only by runs that use it

    return VllmBackend(model, **vllm_options)
