"""The DeepSpeed config of the policy's engine: one home for the trainer and tools/gpu/flagship_check.py,
so that what the GPU check measures is what a run trains with."""

from __future__ import annotations

from typing import Any

import torch

from .reference import zero3_settings


def policy_engine_config(model: torch.nn.Module, *, zero_stage: int, micro_batches: int, grad_clip: float, lr: float,
                         bf16: bool, fp16: bool) -> dict[str, Any]:
    """`deepspeed.initialize`'s config for the policy: `micro_batches` forward/backward passes a step
    (DeepSpeed accumulates them and steps the optimizer after the last), torch's AdamW (no DeepSpeed
    op to compile), ZeRO `zero_stage` with DeepSpeed's defaults otherwise (gpu_memory.py counts them)."""
    return {
        "train_micro_batch_size_per_gpu": 1,  # nominal: a pass takes train.micro_batch_size rows
        "gradient_accumulation_steps": micro_batches,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero3_settings(model) if zero_stage == 3 else {"stage": zero_stage},
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": fp16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
