"""The DeepSpeed config of the policy's engine: one home for the trainer and tools/gpu/flagship_check.py,
so that what the GPU check measures is what a run trains with."""

from __future__ import annotations

from typing import Any

import torch

from .gpu_memory import COMMUNICATION_DTYPE, GRAD_ACCUM_DTYPE, zero_communication
from .reference import zero3_settings


def policy_engine_config(model: torch.nn.Module, *, zero_stage: int, passes: int, grad_clip: float, lr: float,
                         bf16: bool, fp16: bool, gpu: bool) -> dict[str, Any]:
    """`deepspeed.initialize`'s config for the policy: `passes` forward/backward passes a step to start
    with (DeepSpeed accumulates them and steps the optimizer after the last; the trainer sets each
    step's own count, train/passes.py), torch's AdamW (no DeepSpeed op to compile), ZeRO `zero_stage`
    with its communication set for a GPU (`gpu_memory.zero_communication`, DeepSpeed's defaults on the
    CPU; gpu_memory.py counts both). Gradients accumulate over the passes and are reduced over the
    ranks in float32 whatever the model's dtype (`data_types.grad_accum_dtype`, `communication_data_type`):
    a bf16 sum of many passes' parts, or a bf16 reduction, rounds the small contributions away;
    gpu_memory.py counts the float32 partition and the float32 copy of a bucket being reduced."""
    zero = zero3_settings(model) if zero_stage == 3 else {"stage": zero_stage}
    return {
        "train_micro_batch_size_per_gpu": 1,  # nominal: a pass takes the rows its plan packs
        "gradient_accumulation_steps": passes,
        "gradient_clipping": grad_clip,
        "zero_optimization": {**zero, **zero_communication(gpu)},
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
        "data_types": {"grad_accum_dtype": GRAD_ACCUM_DTYPE},
        "communication_data_type": COMMUNICATION_DTYPE,
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
