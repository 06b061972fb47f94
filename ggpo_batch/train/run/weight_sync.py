"""The post-update weight push into the rollout backend, and the probe that checks it took effect.

After each optimizer step the policy's weights go to the behaviour copy (the colocated vLLM engine,
or the torch sampler's copy under ZeRO-3) one tensor at a time, in the training dtype, gathered from
the ZeRO-3 partitions as they stream (`model.named_full_parameters`): no whole-model copy and no
file. Then a cheap probe: the backend's log-probs of a fixed sequence against the policy's own,
judged by train/probe.py (mean gap against the kernels' noise measured at the start, and against
the earlier policies: a push that silently left a layer stale, the bug other GRPO trainers shipped,
TRL #5312, shows once the policy has moved past that noise). A failed probe fails the rollout audit
(`problems`), so the run is never stamped validated; a failed baseline, or `train.max_failed_probes`
failed probes in a row, stops the run on every rank at once (`stop_if_failed`): it ends `failed`, a
training failure, instead of training its whole budget on rollouts from other weights.

vLLM's prompt log-probs skip the sampling processors (temperature, allowed tokens: see vLLM's
`_get_prompt_logprobs_dict`): the probe compares the plain log-softmax over the whole vocabulary at
temperature 1 on both sides, whatever the run's sampling temperature.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...contracts.allocation import write_stopped
from ...errors import EXIT_FAILED, GgpoError
from ..audit.probe import PROBE_NOISE, PROBE_TOKENS, ProbeLog, ProbeStats, probe_logprobs
from ..policy.model import named_full_parameters
from ..rollout.sampler import RolloutBackend
from ..task.codec import Codec
from ..task.qa import Item

log = logging.getLogger(__name__)

PROBE_TEMPLATE = "train"


def probe_sequence(codec: Codec, items: Sequence[Item], limit: int = PROBE_TOKENS) -> list[int]:
    """The fixed probe: the items' prompts, each followed by its gold answer turn, one after another
    until `limit` tokens (and the model's context) are filled."""
    limit = min(limit, codec.max_model_len)
    tokens: list[int] = []
    for item in items:
        tokens += codec.prompt(PROBE_TEMPLATE, item) + codec.answer_target(item.answer)
        if len(tokens) >= limit:
            break
    return tokens[:limit]


class WeightSync:
    """Pushes the policy module's weights into `backend` and probes the result (collective under ZeRO-3).
    The baseline probe runs here, while both still hold the weights the run started from."""

    def __init__(self, module: torch.nn.Module, zero_stage: int, backend: RolloutBackend, tokens: Sequence[int],
                 dtype: str, device: torch.device) -> None:
        self.module, self.zero_stage, self.backend = module, zero_stage, backend
        self.tokens, self.device = list(tokens), device
        self.log = ProbeLog(PROBE_NOISE[dtype])
        baseline = self.log.start(*self._logprobs())
        if not baseline.passed:
            log.error("weight-sync probe: %s", baseline.reason)

    def load(self) -> int:
        """Stream the policy's current weights into the backend; returns how many tensors went."""
        return self.backend.sync_weights(named_full_parameters(self.module, self.zero_stage))

    def push(self, step: int) -> float:
        """Load, then probe (a backend that is awake); returns the load's seconds."""
        t0 = time.perf_counter()
        self.load()
        seconds = time.perf_counter() - t0
        self.probe(step)
        return seconds

    def stop_reason(self, max_failed: int) -> str | None:
        """Why this rank's probes say the run must stop (train/probe.py `ProbeLog.stop_reason`), or None."""
        return self.log.stop_reason(max_failed)

    def probe(self, step: int) -> ProbeStats:
        """Judge the backend against the policy after `step`'s push (train/probe.py)."""
        stats = self.log.add(step, *self._logprobs())
        if not stats.passed:
            log.error("weight-sync probe after step %d: %s", step, stats.reason)
        return stats

    def _logprobs(self) -> tuple[list[float], list[float]]:
        return probe_logprobs(self.backend, self.tokens), probe_logprobs(self.module, self.tokens, self.device)


class ProbeFailed(GgpoError):
    """The weight-sync probe says the rollouts no longer come from the policy: the run stopped, failed
    (a training failure: never retried automatically, never continued)."""

    exit_code = EXIT_FAILED


def stop_if_failed(mine: str | None, failed_ranks: float, *, rank: int, world: int, step: int, folder: Path,
                   history: list[dict[str, Any]]) -> None:
    """After a step's reduction (its `failed_ranks`: the ranks whose probe said stop, summed with the
    step's figures; `mine`: this rank's reason, `ProbeLog.stop_reason`): nothing while it is 0; else,
    on every rank (collective), the ranks' reasons gathered, rank 0 writes them with the step and the
    history so far to the attempt folder's stopped.json (settlement puts the reason into the ledger),
    and every rank raises ProbeFailed."""
    if failed_ranks <= 0:
        return
    reasons: list[Any] = [None] * world
    dist.all_gather_object(reasons, mine)
    reason = "weight-sync probe: " + "; ".join(f"rank {r}: {why}" for r, why in enumerate(reasons) if why)
    reason += f"; stopped at step {step}"
    if rank == 0:
        write_stopped(folder, reason, step=step, cause="weight_sync_probe", history=history)
    log.error("%s", reason)
    raise ProbeFailed(reason)
