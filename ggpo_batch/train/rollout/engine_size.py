"""How many sequences a rank's vLLM engine is built for, from what the job will ask of it.

vLLM's defaults are a server's: room for 1,024 sequences at once (`max_num_seqs`), CUDA graphs
captured for every batch size up to 512 (`max_cudagraph_capture_size`, min(2 x max_num_seqs, 512)),
and a profile run at `max_num_batched_tokens` per rank. A training job knows its largest batch: a
step's rollouts (its rank's share of `prompts_per_step`, `group_size` each) or the evaluation's (its
rank's share of the held-out items, `eval_samples` each), gathered over a tensor-parallel group
(one engine serves the group's prompts). Graphs past that size are never replayed: capturing them
costs start-up seconds and memory the KV cache could have had. Kept apart from `vllm_backend` so
the CPU suite checks the sizes without vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# vLLM 0.32's ceiling for the captured sizes it chooses itself (config/vllm.py: 512, 1,024 on
# data-centre Blackwell); a job's own figure above it is capped there too.
MAX_CAPTURE_SIZE = 512


@dataclass(frozen=True)
class EngineSize:
    max_num_seqs: int  # sequences the engine schedules at once
    max_cudagraph_capture_size: int  # largest batch captured as a CUDA graph (GPU, not eager)

    def options(self, *, graphs: bool) -> dict[str, object]:
        """The `vllm.LLM` keyword arguments: the sequence room always, the capture ceiling where
        graphs are captured (a GPU not in eager mode)."""
        out: dict[str, object] = {"max_num_seqs": self.max_num_seqs}
        if graphs:
            out["compilation_config"] = {"max_cudagraph_capture_size": self.max_cudagraph_capture_size}
        return out


def engine_size(*, prompts_per_step: int, group_size: int, eval_items: int, eval_samples: int, world: int,
                tensor_parallel_size: int = 1) -> EngineSize:
    """The larger of a step's and the evaluation's sequences on one engine (each rank's share,
    rounded up, times the ranks of its tensor-parallel group)."""
    if world < 1 or tensor_parallel_size < 1:
        raise ValueError(f"world {world} and tensor_parallel_size {tensor_parallel_size} must be >= 1")
    step = math.ceil(prompts_per_step / world) * group_size
    evaluation = math.ceil(eval_items / world) * eval_samples
    seqs = max(1, step, evaluation) * tensor_parallel_size
    return EngineSize(max_num_seqs=seqs, max_cudagraph_capture_size=min(seqs, MAX_CAPTURE_SIZE))
