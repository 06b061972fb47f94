"""The frozen reference policy of the KL term, held like the policy.

Under ZeRO-3 it is a DeepSpeed engine without an optimizer under the same stage (DeepSpeed makes a
`DeepSpeedZeRoOffload` for it: parameters partitioned over the ranks, gathered module by module in
its forward), so no rank ever holds a full copy; under ZeRO-2, where every rank holds the policy's
whole weights anyway, it is a plain module. The refresh (policy -> reference every
`reference_refresh_steps`) goes parameter by parameter: gather one policy parameter and the
matching reference one, copy, re-partition.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def zero3_settings(model: torch.nn.Module) -> dict[str, Any]:
    """ZeRO-3 settings shared by the policy and the reference engine: parameters up to 10 x hidden
    elements (norms, biases) stay whole on every rank, as the Hugging Face integration's "auto"
    does; every matrix is partitioned (DeepSpeed's fixed default, 1e5 elements, would keep every
    matrix of a small model whole)."""
    return {"stage": 3, "stage3_param_persistence_threshold": 10 * int(model.config.hidden_size)}


class Reference:
    """The reference model: `call` runs it (the engine under ZeRO-3, else the module), `module` is the
    Hugging Face model inside."""

    def __init__(self, model: torch.nn.Module, *, zero_stage: int, device: torch.device, bf16: bool,
                 fp16: bool) -> None:
        self.zero_stage = zero_stage
        model.requires_grad_(False).eval()
        if zero_stage < 3:
            self.module = model.to(device)
            if bf16:
                self.module.to(torch.bfloat16)
            self.call: Any = self.module
            return
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero3_settings(model),
                  "bf16": {"enabled": bf16}, "fp16": {"enabled": fp16}, "steps_per_print": 10**9}
        self.call, *_ = deepspeed.initialize(model=model, config=config)
        self.module = self.call.module
        self.module.eval()

    def refresh(self, policy: torch.nn.Module) -> None:
        """Copy the policy's weights into the reference (collective under ZeRO-3: every rank calls it)."""
        own = dict(self.module.named_parameters())
        with torch.no_grad():
            if self.zero_stage < 3:
                for name, p in policy.named_parameters():
                    own[name].copy_(p.detach().to(own[name].dtype))
                return
            import deepspeed

            for name, p in policy.named_parameters():
                r = own[name]
                # Rank 0's copy is broadcast and re-partitioned on exit; all ranks hold the same anyway.
                with deepspeed.zero.GatheredParameters([p]), deepspeed.zero.GatheredParameters([r], modifier_rank=0):
                    r.data.copy_(p.data.to(r.dtype))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The reference's full weights on the CPU, one parameter gathered at a time (collective)."""
        from .model import named_full_parameters

        return {n: t.cpu().clone() for n, t in named_full_parameters(self.module, self.zero_stage)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Put `state` (from `state_dict`) back, re-partitioning under ZeRO-3 (collective)."""
        own = dict(self.module.named_parameters())
        missing = sorted(set(own) - set(state))
        if missing:
            raise KeyError(f"reference checkpoint lacks {len(missing)} parameters, e.g. {missing[0]}")
        with torch.no_grad():
            if self.zero_stage < 3:
                for name, r in own.items():
                    r.copy_(state[name].to(r.dtype))
                return
            import deepspeed

            for name, r in own.items():
                with deepspeed.zero.GatheredParameters([r], modifier_rank=0):
                    r.data.copy_(state[name].to(r.device, r.dtype))


def resident_elements(module: torch.nn.Module) -> tuple[int, int]:
    """(elements of the weights this rank holds, elements of the whole model) of `module`'s parameters:
    under ZeRO-3 a partitioned parameter counts its local partition, a gathered or persistent one its
    whole tensor (its partition beside it is not counted again)."""
    held = total = 0
    for p in module.parameters():
        full = int(getattr(p, "ds_numel", p.numel()))
        total += full
        gathered = p.data.numel() > 0  # a partitioned parameter's data is an empty placeholder
        held += full if gathered or not hasattr(p, "ds_tensor") else int(p.ds_tensor.numel())
    return held, total
