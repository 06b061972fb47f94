"""The report's statistics against hand-computed cases (ggpo_batch/reporting/stats.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import bootstrap

from ggpo_batch.reporting import stats

# t_{0.975, 2}, the 95 % two-sided quantile with 3 values: exactly 0.95 / sqrt(0.04875) =
# 4.30265272974946385... (the often quoted 4.302652729911275 agrees to 10 digits)
T_975_2 = 4.302652729749464
T_975_4 = 2.7764451051977987  # t_{0.975, 4}


def test_t_quantiles_are_the_tabulated_ones() -> None:
    # df = 2 has a closed form: t_p = (2p - 1) / sqrt(2 p (1 - p)) = 0.95 / sqrt(0.04875) at p = 0.975
    assert T_975_2 == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-15)
    assert stats.t_quantile(2) == pytest.approx(T_975_2, rel=1e-12)
    assert stats.t_quantile(4) == pytest.approx(T_975_4, rel=1e-9)


def test_three_values_get_the_t_interval() -> None:
    s = stats.summary([1.0, 2.0, 3.0])
    # mean 2, s = 1, se = 1/sqrt(3): 2 -+ 4.302652729911275 / sqrt(3) = 2 -+ 2.4841377...
    half = T_975_2 / math.sqrt(3)
    assert s["mean"] == 2.0 and s["std"] == 1.0 and s["n"] == 3 and s["ci95_method"] == "t"
    assert s["ci95"] == pytest.approx([2 - half, 2 + half], rel=1e-9)
    assert s["ci95"][0] == pytest.approx(-0.48413771175033, rel=1e-9)


def test_paired_differences_by_seed() -> None:
    arm = {1: 0.60, 2: 0.80, 3: 0.70, 4: 0.9}
    base = {1: 0.40, 2: 0.50, 3: 0.45, 5: 0.1}
    d = stats.paired(arm, base)
    # differences 0.20, 0.30, 0.25: mean 0.25, s 0.05, half-width t_{0.975,2} 0.05 / sqrt(3) = 0.1242069...
    assert d["per_seed"] == pytest.approx({"1": 0.2, "2": 0.3, "3": 0.25})
    assert d["unpaired"] == ["4", "5"] and d["n"] == 3
    assert d["mean"] == pytest.approx(0.25) and d["std"] == pytest.approx(0.05)
    assert d["ci95"] == pytest.approx([0.25 - 0.12420689, 0.25 + 0.12420689], abs=1e-8)


def test_welch_interval_hand_computed() -> None:
    w = stats.welch([1, 2, 3], [2, 4, 6])
    # diff 2; variances of the means 1/3 and 4/3; se sqrt(5/3); df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17
    assert w["mean"] == 2.0 and w["df"] == pytest.approx(50 / 17, rel=1e-12)
    half = stats.t_quantile(50 / 17) * math.sqrt(5 / 3)
    assert w["ci95"] == pytest.approx([2 - half, 2 + half], rel=1e-9)
    assert 3.18 < stats.t_quantile(50 / 17) < 3.25  # between t_{.975,3} = 3.182 and t_{.975,2.9}
    assert stats.welch([1], [2, 3])["ci95"] is None and stats.welch([], [1])["mean"] is None


def test_edges_one_value_and_constant_values() -> None:
    assert stats.summary([0.5]) == {"mean": 0.5, "std": None, "n": 1, "ci95": None, "ci95_method": None}
    assert stats.summary([]) == {"mean": None, "std": None, "n": 0, "ci95": None, "ci95_method": None}
    assert stats.summary([0.25, 0.25, 0.25])["ci95"] == [0.25, 0.25]
    assert stats.summary([1.0, None, float("nan"), 3.0])["n"] == 2  # missing values are not values


def test_many_seeds_get_the_seeded_bca_bootstrap() -> None:
    rng = np.random.default_rng(3)
    xs = list(rng.lognormal(0.0, 0.75, size=stats.BOOTSTRAP_MIN_N))
    s = stats.summary(xs)
    assert s["ci95_method"] == "bootstrap_bca" and s["n"] == stats.BOOTSTRAP_MIN_N
    ref = bootstrap((np.asarray(xs),), np.mean, confidence_level=0.95, n_resamples=stats.BOOTSTRAP_RESAMPLES,
                    method="BCa", rng=np.random.default_rng(stats.BOOTSTRAP_SEED)).confidence_interval
    assert s["ci95"] == pytest.approx([ref.low, ref.high], rel=1e-12)
    assert s["ci95"][0] <= s["mean"] <= s["ci95"][1]
    assert stats.summary(xs) == s  # seeded: the same ledger gives the same report
    assert stats.summary(xs[:-1])["ci95_method"] == "t"  # one seed fewer: the t interval
    assert stats.excludes_zero(s) is True and stats.excludes_zero({"ci95": [-1, 1]}) is False
