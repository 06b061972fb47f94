"""The weight-sync probe's criterion (ggpo_batch/train/audit/probe.py) on log-prob vectors shaped like a run's:
a policy that drifts a little each step, a backend that follows it with kernel noise (correct), or that
stops following it (stale). Real models and pushes: test_weight_sync.py, test_probe_calibration.py."""

from __future__ import annotations

import pickle

import pytest
import torch

from ggpo_batch.train.audit.probe import PROBE_NOISE, ProbeLog, ProbeNoise, gap_statistics, merged_details

TOKENS = 255
NOISE = ProbeNoise(floor=1e-3, ceiling=0.1)


def drifting_policy(steps: int, per_step: float, seed: int = 0) -> list[torch.Tensor]:
    """Log-probs of the probe under a policy whose every step moves each token by about `per_step`."""
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(TOKENS, generator=g, dtype=torch.float64) * 8
    out = [lp]
    for _ in range(steps):
        lp = lp + torch.randn(TOKENS, generator=g, dtype=torch.float64) * per_step
        out.append(lp)
    return out


def kernels(lp: torch.Tensor, sigma: float, g: torch.Generator) -> torch.Tensor:
    """Another implementation's log-probs of the same weights: heavy-tailed noise of mean |.| ~ sigma."""
    noise = torch.randn(TOKENS, generator=g, dtype=torch.float64) * sigma
    spikes = torch.rand(TOKENS, generator=g, dtype=torch.float64) < 0.02
    return lp + torch.where(spikes, noise * 20, noise)  # a few tokens 20x off, as bf16 kernels do


def test_correct_pushes_pass_and_a_stopped_push_is_caught_once_the_policy_moved_past_the_noise():
    g = torch.Generator().manual_seed(1)
    policies = drifting_policy(60, per_step=2e-3)
    sigma = 3e-3
    correct, stale = ProbeLog(NOISE), ProbeLog(NOISE)
    correct.start(kernels(policies[0], sigma, g), policies[0])
    stale.start(kernels(policies[0], sigma, g), policies[0])
    stop = 10  # the stale backend keeps the policy of step `stop`
    for step in range(60):
        p = policies[step + 1]
        correct.add(step, kernels(p, sigma, g), p)
        stale.add(step, kernels(policies[min(step, stop) + 1], sigma, g), p)
    assert correct.passed and correct.steps_checked == 60 and correct.failures == []
    assert sum(s.decisive for s in correct.probes) > 40  # the relative test was live, and never fired
    assert not stale.passed
    first = stale.failures[0]
    # No claim while the stale copy was within the kernels' noise of the policy...
    for s in stale.probes:
        if s.step >= 0 and float((policies[s.step + 1] - policies[stop + 1]).abs().mean()) <= stale.noise:
            assert s.passed, s
    # ...caught once it had moved a few noise widths, nearer to an earlier policy than the current one.
    drift = float((policies[first.step + 1] - policies[stop + 1]).abs().mean())
    assert stale.noise < drift < 4 * stale.bound, (drift, stale.noise)
    assert first.nearest_step is not None and first.nearest_gap < first.gap and "nearer to the policy" in first.reason
    assert stale.failures[-1].step == 59  # and stays caught


def test_absolute_bound_nan_and_length_mismatch_fail():
    p = drifting_policy(1, 1e-3)[0]
    log = ProbeLog(NOISE)
    log.start(p + 2e-3, p)
    assert log.baseline == pytest.approx(2e-3) and log.bound == pytest.approx(8e-3)
    assert log.add(0, p + 5e-3, p).passed
    wrong = log.add(1, p + 0.05, p)  # a wrong mapping / lossy cast: far beyond the noise at once
    assert not wrong.passed and "bound" in wrong.reason and wrong.gap == pytest.approx(0.05)
    nan = p.clone()
    nan[3] = float("nan")
    assert not log.add(2, nan, p).passed
    assert not log.add(3, p[:-1], p).passed and log.probes[-1].gap == float("inf")
    assert [s.step for s in log.failures] == [1, 2, 3]
    assert all(line.startswith(f"weight-sync probe after step {s}:") for s, line in zip((1, 2, 3), log.problems()))


def test_baseline_over_the_dtype_ceiling_fails_before_any_push():
    p = drifting_policy(1, 1e-3)[0]
    log = ProbeLog(PROBE_NOISE["bfloat16"])
    stats = log.start(p + 1.0, p)  # the engine serves another model than the policy's
    assert not stats.passed and log.baseline is None and log.noise == PROBE_NOISE["bfloat16"].floor
    assert log.problems()[0].startswith("weight-sync probe before the first push:")
    log.add(0, p, p)
    assert not log.passed  # the failed baseline stays a failure


def test_floor_keeps_the_bound_when_the_kernels_agree_exactly():
    p = drifting_policy(1, 1e-3)[0]
    log = ProbeLog(PROBE_NOISE["float32"])
    log.start(p, p)  # identical kernels: baseline 0
    assert log.baseline == 0 and log.bound == 4 * PROBE_NOISE["float32"].floor
    assert log.add(0, p + 1e-6, p).passed


def test_gap_statistics_and_merged_details_over_ranks():
    g = gap_statistics([0.0] * 99 + [1.0], [0.0] * 100)
    assert (g.tokens, g.mean, g.max) == (100, 0.01, 1.0) and 0 < g.p99 <= 1.0
    p = drifting_policy(2, 1e-2)
    good, bad = ProbeLog(NOISE), ProbeLog(NOISE)
    for log in (good, bad):
        log.start(p[0] + 1e-3, p[0])
        log.add(0, p[1] + 1e-3, p[1])
    good.add(1, p[2] + 1e-3, p[2])
    bad.add(1, p[1], p[2])  # this rank's engine kept step 0's weights
    merged = merged_details([good, bad, None])
    assert merged["checked"] and merged["passed"] is False and merged["failed_steps"] == [1]
    assert merged["steps_checked"] == 2 and merged["bound"] == pytest.approx(4e-3)
    assert merged["baseline"] == pytest.approx(1e-3) and merged["largest_gap"] > 4e-3
    assert "mean |backend - policy|" in merged["criterion"]
    assert merged_details([good])["passed"] is True
    assert merged_details([None]) == {"checked": False,
                                      "reason": "rollouts sample from the policy module itself: no weight push"}
    assert ProbeLog(NOISE).passed is False  # nothing probed is not a pass
    shipped = pickle.loads(pickle.dumps(bad))  # the audit gathers the logs: the window stays home
    assert len(shipped._earlier) == 0 and shipped.probes == bad.probes and shipped.passed is False


def test_the_stop_decision_counts_consecutive_failures_after_a_good_baseline() -> None:
    """train.max_failed_probes: the run stops after that many failed probes in a row (a pass resets the
    count); a failed baseline stops it at once (ProbeLog.stop_reason, carried on the step's reduction)."""
    p = drifting_policy(1, 1e-3)[0]
    log = ProbeLog(PROBE_NOISE["float32"])
    log.start(p, p)
    assert log.stop_reason(3) is None
    verdicts = []
    for step, good in enumerate([False, False, True, False, False, False]):
        log.add(step, p if good else p + 1.0, p)
        verdicts.append(log.stop_reason(3))
    assert verdicts[:5] == [None] * 5
    assert verdicts[5] is not None and verdicts[5].startswith("3 consecutive probes failed (train.max_failed_probes = 3); "
                                                                "after step 5: the backend's log-probs differ")
    assert log.stop_reason(4) is None and log.stop_reason(1) is not None
    bad = ProbeLog(PROBE_NOISE["float32"])
    bad.start(p + 1.0, p)
    assert bad.stop_reason(3).startswith("the baseline failed: before any push the backend differs")  # type: ignore[union-attr]
