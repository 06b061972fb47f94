"""The planner's statistics (ggpo_batch/reporting/power.py, sequential.py) against statsmodels and
against simulation: seeded, deterministic, seconds each on one core.

Tolerances: an empirical rate from R draws is within 4 standard errors sqrt(p(1 - p) / R) of the
predicted one (a wrong formula misses by far more; a correct one fails a cell about 6e-5 of the time
at a random seed, never at these fixed seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ggpo_batch.reporting import power as P
from ggpo_batch.reporting import sequential as S

statsmodels_power = pytest.importorskip("statsmodels.stats.power")


def test_power_matches_statsmodels_where_it_is_not_nan_and_has_no_nan_where_it_is() -> None:
    tt = statsmodels_power.TTestPower()
    holes = worst = 0.0
    for dz in np.arange(0.1, 5.01, 0.1):
        for n in range(3, 51):
            mine = P.power(float(dz), n, 0.05)
            assert math.isfinite(mine) and 0 <= mine <= 1
            theirs = tt.power(effect_size=float(dz), nobs=n, alpha=0.05, alternative="two-sided")
            if math.isnan(theirs):
                holes += 1
                # scipy's NaN (issue 25470) is in a lower tail below Phi(-nc): the upper tail alone
                nc = dz * math.sqrt(n)
                assert stats.norm.cdf(-nc) < 1e-9
                assert mine == pytest.approx(stats.nct.sf(stats.t.isf(0.025, n - 1), n - 1, nc), abs=1e-15)
            else:
                worst = max(worst, abs(mine - theirs))
    assert holes > 700 and worst < 1e-10
    assert P.power(13.33, 10, 0.05) == 1.0 and P.seeds_needed(13.33, 0.8, 0.05) == 2
    assert math.isnan(tt.power(effect_size=13.33, nobs=10, alpha=0.05))  # what the guard is for


def test_seeds_and_the_smallest_detectable_effect_match_the_reference_figures() -> None:
    tt = statsmodels_power.TTestPower()
    assert tt.solve_power(0.5, power=0.8, alpha=0.05) == pytest.approx(33.367, abs=1e-3)
    assert P.seeds_needed(0.5, 0.8, 0.05) == 34  # the ceiling, checked as an integer
    assert P.power(0.5, 33, 0.05) < 0.8 <= P.power(0.5, 34, 0.05)
    for n, want in ((3, 3.264), (5, 1.682), (10, 0.996), (20, 0.660)):
        assert P.mde(n, 0.8, 0.05) == pytest.approx(want, abs=1e-3)
        assert P.mde(n, 0.8, 0.05) == pytest.approx(tt.solve_power(None, nobs=n, alpha=0.05, power=0.8), abs=1e-6)
    # the figures: 3 seeds detect 3.26 sd; after Holm over 4 arms (planned at alpha / 4), 6.5
    assert P.mde(3, 0.8, P.alpha_per_arm(0.05, 4, "holm")) == pytest.approx(6.55, abs=0.01)
    assert P.seeds_needed(0.0, 0.8, 0.05) is None and P.mde(1, 0.8, 0.05) == math.inf


def test_sigma_uncertainty_the_robust_count_and_holm() -> None:
    assert P.sigma_ucl(1.0, 2) == pytest.approx(2.12, abs=0.01)
    assert P.sigma_ucl(1.0, 8) == pytest.approx(1.32, abs=0.01)
    lo, hi = (math.sqrt(2 / stats.chi2.ppf(q, 2)) for q in (0.975, 0.025))
    assert (lo, hi) == (pytest.approx(0.52, abs=0.01), pytest.approx(6.28, abs=0.01))
    assert (hi / lo) ** 2 == pytest.approx(145, rel=0.02)  # the factor on the seeds needed
    assert P.seeds_robust(5, 3.71, 8, 0.8, 0.0125) > P.seeds_needed(5 / 3.71, 0.8, 0.0125)
    from statsmodels.stats.multitest import multipletests

    ps = [0.034, 0.142, 0.199, 1.0]
    assert P.holm(ps) == pytest.approx(list(multipletests(ps, method="holm")[1]))
    assert P.holm(ps)[0] == pytest.approx(0.136)
    assert P.pooled_sd([(3.0, 2), (5.0, 2)]) == (pytest.approx(math.sqrt(17)), 4)
    assert P.pooled_sd([(3.0, 0)]) is None


@pytest.mark.parametrize("dz", [0.0, 0.5, 1.0, 2.0])
def test_predicted_power_matches_the_empirical_rejection_rate(dz: float) -> None:
    reps = 4000
    rng = np.random.default_rng(int(dz * 100) + 7)
    for n in (3, 5, 10):
        x = rng.standard_normal((reps, n)) + dz
        empirical = float(np.mean(stats.ttest_1samp(x, 0, axis=1).pvalue < 0.05))
        predicted = P.power(dz, n, 0.05) if dz else 0.05
        tol = 4 * math.sqrt(predicted * (1 - predicted) / reps)
        assert abs(empirical - predicted) <= tol, (dz, n, empirical, predicted, tol)


def test_the_planned_seed_count_is_the_first_that_reaches_the_power() -> None:
    reps, dz = 4000, 1.0
    need = P.seeds_needed(dz, 0.8, 0.05)
    assert need == 10
    rng = np.random.default_rng(11)
    rates = {}
    for n in (need - 1, need):
        x = rng.standard_normal((reps, n)) + dz
        rates[n] = float(np.mean(stats.ttest_1samp(x, 0, axis=1).pvalue < 0.05))
    tol = 4 * math.sqrt(0.8 * 0.2 / reps)
    assert rates[need] >= 0.8 - tol and rates[need - 1] < 0.8 + tol


def test_type_s_and_m_match_simulation() -> None:
    reps = 40_000
    for dz, n in ((0.5, 3), (1.0, 10)):
        x = np.random.default_rng(5).standard_normal((reps, n)) + dz
        sig = stats.ttest_1samp(x, 0, axis=1).pvalue < 0.05
        means = x.mean(axis=1)[sig]
        e = P.design_errors(dz, n, 0.05)
        assert e.power == pytest.approx(P.power(dz, n, 0.05), abs=1e-3)
        assert e.type_m == pytest.approx(float(np.mean(np.abs(means))) / dz, rel=0.05)
        assert e.type_s == pytest.approx(float(np.mean(means < 0)), abs=0.01)
    assert P.design_errors(0.5, 3, 0.05).type_m == pytest.approx(2.21, abs=0.05)  # the design note's C5


def test_predictive_success_is_seeded_and_sensible() -> None:
    clear, unclear = [-10, -8, -5], [0, 3, -3]
    assert P.predictive_success(clear, 7, 0.05) > 0.8 > P.predictive_success(unclear, 7, 0.05)
    assert P.predictive_success(clear, 7, 0.05) == P.predictive_success(clear, 7, 0.05)
    assert P.predictive_success([2, 2, 2], 3, 0.05) == 1.0  # s = 0: no division by zero


def test_spending_functions_and_exact_boundaries() -> None:
    assert S.spent(1.0, 0.05) == pytest.approx(0.05) and S.spent(1.0, 0.05, "pocock") == pytest.approx(0.05)
    assert S.spent(0.3, 0.05) < S.spent(0.3, 0.05, "pocock")
    obf = S.boundaries([3, 5, 7, 10], 0.05)
    # the design note's simulated boundaries 48.7, 5.52, 3.34, 2.41 (the first is exact here: Student's t)
    assert obf[0] == pytest.approx(stats.t.isf(S.spent(0.3, 0.05) / 2, 2))
    assert obf[1:] == [pytest.approx(5.52, rel=0.03), pytest.approx(3.34, rel=0.02), pytest.approx(2.41, rel=0.01)]
    assert S.boundaries([3, 5, 7, 10], 0.05, "pocock") == [pytest.approx(c, rel=0.03) for c in (6.85, 4.21, 3.47, 2.95)]
    assert S.check_waves([3, 3]) and S.check_waves([1, 4]) and S.check_waves([3, 5]) is None


@pytest.mark.parametrize("waves", [[3, 5, 7, 10], [2, 4, 6], [3, 6, 9, 12, 15]])
def test_spending_keeps_the_false_positive_rate_where_looking_at_every_wave_does_not(waves: list[int]) -> None:
    alpha, paths = 0.05, 40_000
    se = math.sqrt(alpha * (1 - alpha) / paths)
    for kind in S.SPENDING:
        fpr = S.operating(waves, S.boundaries(waves, alpha, kind), 0.0, paths=paths).rejects
        assert alpha - 3 * se <= fpr <= alpha + 3 * se, (kind, fpr)
    naive = S.operating(waves, S.naive(waves, alpha), 0.0, paths=paths).rejects
    assert naive > 0.09, naive  # the naive rule fails: 0.13 at 3/5/7/10
    # the same law at another sigma and mean: T is scale free, so the boundaries hold for any sigma
    big = S.operating(waves, S.boundaries(waves, alpha), 0.0, paths=paths, seed=99).rejects
    assert abs(big - alpha) <= 3 * se


def test_sequential_power_and_expected_seeds_match_the_design_note() -> None:
    obf = S.boundaries([3, 5, 7, 10], 0.05)
    h1 = S.operating([3, 5, 7, 10], obf, 1.0)
    assert h1.rejects == pytest.approx(0.772, abs=4 * h1.se) and h1.expected_seeds == pytest.approx(8.77, abs=0.05)
    again = S.operating([3, 5, 7, 10], obf, 1.0, seed=4242)
    assert abs(again.rejects - h1.rejects) <= 4 * math.hypot(h1.se, again.se)


def test_futility_is_non_binding_and_stops_arms_going_nowhere() -> None:
    last = S.boundaries([3, 5, 7, 10], 0.05)[-1]
    # the seed record's `paired` steps: P(success at 10 seeds) 0.14 in the design note
    assert P.predictive_success([0, 3, -3], 7, 0.05, critical=last) == pytest.approx(0.14, abs=0.03)
    assert S.futile([0, 3, -3], 10, last, 0.20) and not S.futile([0, 3, -3], 10, last, 0.10)
    assert not S.futile([-10, -8, -5], 10, last, 0.10)
    assert not S.futile([0, 3, -3], 10, last, 0.0)  # 0: off


def test_a_look_reads_the_wave_its_seeds_reach() -> None:
    waves = [3, 5, 7, 10]
    bounds = S.boundaries(waves, 0.05)
    early = S.look([-10, -8], waves, bounds)
    assert (early.look, early.next_wave, early.t) == (0, 3, None)
    first = S.look([-10, -8, -5, -9], waves, bounds)  # 4 seeds: still look 1 (3 seeds), which never stops
    assert (first.look, first.seeds, first.crossed, first.next_wave) == (1, 3, False, 5)
    strong = S.look([-10.0, -8, -5, -9, -7, -8, -9], waves, bounds)
    assert (strong.look, strong.crossed, strong.boundary) == (3, True, pytest.approx(bounds[2]))
    flat = S.look([0, 3, -3, 1, -1], waves, bounds, futility=0.2)
    assert flat.look == 2 and not flat.crossed and flat.futile
    last = S.look([0, 3, -3, 1, -1, 2, -2, 1, 0, -1], waves, bounds, futility=0.2)
    assert (last.look, last.next_wave, last.futile) == (4, None, False)  # the last look: no futility, no next


def test_the_combination_test_holds_alpha_where_pooling_the_extended_seeds_does_not() -> None:
    """3 seeds, then +2 to confirm a good interim (one-sided p < 0.15) or +7 to rescue an unclear one
    (the design note's C4: the natural rule; the weights planned with +7). Vectorized; `combined`
    itself is checked against the vectorized figure on the first paths."""
    reps, alpha = 100_000, 0.05
    rng = np.random.default_rng(3)
    first = rng.standard_normal((reps, 3))
    confirm = stats.ttest_1samp(first, 0, axis=1).pvalue < 0.3  # two-sided 0.3 = one-sided 0.15
    w1 = math.sqrt(3 / 10)
    z1 = stats.norm.isf(stats.ttest_1samp(first, 0, axis=1, alternative="greater").pvalue)
    pooled = np.zeros(reps, dtype=bool)
    combined = np.zeros(reps, dtype=bool)
    for more, rows in ((2, confirm), (7, ~confirm)):
        added = rng.standard_normal((int(rows.sum()), more))
        pooled[rows] = stats.ttest_1samp(np.hstack([first[rows], added]), 0, axis=1).pvalue < alpha
        z2 = stats.norm.isf(stats.ttest_1samp(added, 0, axis=1, alternative="greater").pvalue)
        z = w1 * z1[rows] + math.sqrt(1 - w1 * w1) * z2
        combined[rows] = 2 * stats.norm.sf(np.abs(z)) < alpha
        k = int(np.flatnonzero(rows)[0])
        assert P.combined(first[k], added[0], 7)[0] == pytest.approx(float(z[0]), abs=1e-9)
    se = math.sqrt(alpha * (1 - alpha) / reps)
    assert abs(combined.mean() - alpha) <= 3 * se, combined.mean()
    assert pooled.mean() > alpha + 3 * se, pooled.mean()  # the naive pooled test fails
