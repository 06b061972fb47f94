"""Power of the paired t-test over seeds: how many seeds an arm needs against its baseline, the
smallest effect n seeds can detect, and what a significant result at n seeds is worth.

The unit is the seed: d_i = arm_i - baseline_i, the test two-sided on T = mean(d) / (sd(d) / sqrt(n))
with n - 1 degrees of freedom (what `report` prints for n < 30). Power is exact, from the noncentral t
(df = n - 1, noncentrality d_z sqrt(n), d_z = effect / sigma of the differences):

    power(n, d_z) = P(T' >= c) + P(T' <= -c),  c = t_{1 - alpha/2, n - 1}

scipy's noncentral t returns NaN far in its lower tail (scipy issue 25470; boostorg/math#1430): on
d_z 0.1..5 x n 3..50, 776 of 2,450 lower tails. There the tail is below Phi(-nc) < 1e-16, so it is
taken as 0 (`_tail`). statsmodels' TTestPower, which adds the same tails, is the tests' cross-check.

Sigma is uncertain: with df degrees of freedom behind s, df s^2 / sigma^2 is chi-square(df), and a
3-seed s (df 2) puts sigma anywhere in [0.52 s, 6.28 s] (95 %). `seeds_robust` plans at the upper
confidence limit of sigma (Browne 1995): at 80 % it reaches the power with probability >= 0.8.
Several arms against one baseline are a family: Holm (`holm`) tests them, and plans are made at
alpha / arms (Holm's first step, conservative). Pure functions of numbers; scipy on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MULTIPLICITY = ("holm", "bonferroni", "none")
MOST_SEEDS = 100_000  # a search for seeds stops here: beyond it no number of seeds is worth naming
UCL_CONFIDENCE = 0.8  # the upper confidence limit of sigma a robust count plans at
SIGMA_QUANTILES = 2000  # the fixed chi-square grid type S / M average over (deterministic, no draws)


def alpha_per_arm(alpha: float, arms: int, multiplicity: str = "holm") -> float:
    """The level each arm is planned at: alpha / arms under Holm or Bonferroni, alpha with none."""
    if multiplicity not in MULTIPLICITY:
        raise ValueError(f"multiplicity {multiplicity!r}: one of {', '.join(MULTIPLICITY)}")
    return alpha if multiplicity == "none" or arms <= 1 else alpha / arms


def critical_t(n: int, alpha: float) -> float:
    """c = t_{1 - alpha/2, n - 1}: |T| >= c rejects (n >= 2)."""
    from scipy.stats import t

    return float(t.isf(alpha / 2, n - 1))


def _tail(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def power(dz: float, n: int, alpha: float) -> float:
    """The two-sided paired t-test's power at standardized effect `dz` with `n` seeds (n >= 2)."""
    from scipy.stats import nct

    if n < 2:
        return 0.0
    c, nc, df = critical_t(n, alpha), abs(dz) * math.sqrt(n), n - 1
    upper = float(nct.sf(c, df, nc))
    if math.isnan(upper):  # not met on the tested grid; the normal limit is then exact to 1e-16
        from scipy.stats import norm

        upper = float(norm.sf(c - nc))
    return min(1.0, upper + _tail(float(nct.cdf(-c, df, nc))))


def seeds_needed(dz: float, target: float, alpha: float, *, most: int = MOST_SEEDS) -> int | None:
    """The fewest seeds (>= 2) whose power at `dz` reaches `target`; None when more than `most` (or
    dz is 0: no number of seeds detects no difference)."""
    if dz == 0 or not math.isfinite(dz):
        return 2 if math.isinf(dz) else None
    if power(dz, most, alpha) < target:
        return None
    lo, hi = 1, 2  # power(lo) < target <= power(hi), doubling then bisecting (power rises with n)
    while power(dz, hi, alpha) < target:
        lo, hi = hi, min(2 * hi, most)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if power(dz, mid, alpha) < target else (lo, mid)
    return hi


def mde(n: int, target: float, alpha: float) -> float:
    """The smallest |d_z| `n` seeds detect with power `target` (inf below 2 seeds)."""
    from scipy.optimize import brentq

    if n < 2:
        return math.inf
    hi = 1.0
    while power(hi, n, alpha) < target:
        hi *= 2
        if hi > 1e6:
            return math.inf
    return float(brentq(lambda d: power(d, n, alpha) - target, 0.0, hi, xtol=1e-10))


def sigma_ucl(s: float, df: float, confidence: float = UCL_CONFIDENCE) -> float:
    """The upper `confidence` limit of sigma from an s with `df` degrees of freedom: s sqrt(df / chi2_{1-conf, df})."""
    from scipy.stats import chi2

    return s * math.sqrt(df / float(chi2.ppf(1 - confidence, df)))


def seeds_robust(effect: float, s: float, df: float, target: float, alpha: float,
                 confidence: float = UCL_CONFIDENCE) -> int | None:
    """Seeds needed when sigma is taken at its upper `confidence` limit (Browne 1995)."""
    if s <= 0 or df <= 0:
        return seeds_needed(math.inf if effect else 0.0, target, alpha)
    return seeds_needed(effect / sigma_ucl(s, df, confidence), target, alpha)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (valid under any dependence)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def adjust(pvalues: Sequence[float], multiplicity: str) -> list[float]:
    """p-values adjusted over the family of arms: Holm, Bonferroni or as they are."""
    if multiplicity == "holm":
        return holm(pvalues)
    if multiplicity == "bonferroni":
        return [min(1.0, p * len(pvalues)) for p in pvalues]
    return list(pvalues)


@dataclass(frozen=True)
class Errors:
    """What a significant result at n seeds is worth when the true effect is d_z (Gelman & Carlin 2014)."""

    power: float
    type_s: float  # P(the sign is wrong | significant)
    type_m: float  # E[|estimate| | significant] / |true effect|: the exaggeration


def design_errors(dz: float, n: int, alpha: float) -> Errors:
    """Power, type S and type M of the paired t-test at true standardized effect `dz` != 0, n >= 2 seeds.

    Exact up to a fixed quadrature over sigma's chi-square law: mean(d) ~ N(dz, 1/n) (sigma = 1) and
    s independent; the test rejects when |mean| >= c s / sqrt(n)."""
    import numpy as np
    from scipy.stats import chi2, norm

    if n < 2 or dz == 0:
        return Errors(power(dz, n, alpha) if n >= 2 else 0.0, math.nan, math.nan)
    mu, tau, df = abs(dz), 1 / math.sqrt(n), n - 1
    q = (np.arange(SIGMA_QUANTILES) + 0.5) / SIGMA_QUANTILES
    s = np.sqrt(chi2.ppf(q, df) / df)
    k = critical_t(n, alpha) * s / math.sqrt(n)
    a, b = (k - mu) / tau, (-k - mu) / tau  # upper and lower rejection edges, standardized
    p_hi, p_lo = norm.sf(a), norm.cdf(b)
    e_hi = mu * p_hi + tau * norm.pdf(a)  # E[X; X >= k]
    e_lo = -mu * p_lo + tau * norm.pdf(b)  # E[-X; X <= -k]
    reject = float(np.mean(p_hi + p_lo))
    if reject == 0:
        return Errors(0.0, math.nan, math.nan)
    return Errors(reject, float(np.mean(p_lo)) / reject, float(np.mean(e_hi + e_lo)) / reject / mu)


def predictive_success(diffs: Sequence[float], more: int, alpha: float, *, critical: float | None = None,
                       draws: int = 20_000, seed: int = 20261012) -> float:
    """P(the paired t-test on `diffs` and `more` further seeds rejects at `alpha` | the differences so
    far): flat prior on the mean, Jeffreys on sigma; seeded draws, so the same data give the same
    figure. `critical`: the |t| to cross instead of t_{1-alpha/2} (a sequential design's last boundary)."""
    import numpy as np

    n = len(diffs)
    if n < 2 or more < 0:
        return math.nan
    x = np.asarray(diffs, dtype=float)
    mean, ss = float(x.mean()), float(((x - x.mean()) ** 2).sum())
    total = n + more
    c = critical if critical is not None else critical_t(total, alpha)
    if ss == 0:  # every seed differed by the same amount: nothing left to learn about sigma
        return 1.0 if mean != 0 else 0.0
    rng = np.random.default_rng(seed)
    sigma = np.sqrt(ss / rng.chisquare(n - 1, draws))
    mu = rng.normal(mean, sigma / math.sqrt(n))
    if more == 0:
        t_now = mean / math.sqrt(ss / (n - 1) / n)
        return float(abs(t_now) >= c)
    f_mean = rng.normal(mu, sigma / math.sqrt(more))
    f_ss = sigma**2 * rng.chisquare(more - 1, draws) if more > 1 else np.zeros(draws)
    all_mean = (n * mean + more * f_mean) / total
    all_ss = ss + f_ss + n * more / total * (mean - f_mean) ** 2
    t_all = all_mean / np.sqrt(all_ss / (total - 1) / total)
    return float(np.mean(np.abs(t_all) >= c))


def pooled_sd(groups: Sequence[tuple[float, int]]) -> tuple[float, int] | None:
    """(s_p, df) of (sd, df) pairs: s_p^2 = sum df s^2 / sum df; None without any degree of freedom."""
    df = sum(d for _, d in groups if d > 0)
    if df == 0:
        return None
    return math.sqrt(math.fsum(d * s * s for s, d in groups if d > 0) / df), df


def combined(first: Sequence[float], added: Sequence[float], planned_added: int) -> tuple[float, float]:
    """(z, two-sided p) of the inverse-normal combination test (Lehmacher & Wassmer 1999) of the seeds
    run first and the seeds added after looking at them, each stage's paired t turned into a z, with
    weights fixed before the look: w1^2 = n1 / (n1 + planned_added). Valid whatever rule chose how
    many seeds to add (pooling the seeds into one t-test is not: 'add few to confirm a good interim,
    many to rescue an unclear one' inflates alpha). Both stages need 2 seeds or more."""
    from scipy.stats import norm
    from scipy.stats import t as student

    def stage_z(xs: Sequence[float]) -> float:
        n = len(xs)
        mean = math.fsum(xs) / n
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
        if sd == 0:
            return math.copysign(math.inf, mean) if mean else 0.0
        return float(norm.isf(student.sf(mean / (sd / math.sqrt(n)), n - 1)))

    if len(first) < 2 or len(added) < 2 or planned_added < 1:
        raise ValueError("each stage needs 2 seeds or more, and the added seeds a planned number")
    w1 = math.sqrt(len(first) / (len(first) + planned_added))
    z = w1 * stage_z(first) + math.sqrt(1 - w1 * w1) * stage_z(added)
    return z, float(2 * norm.sf(abs(z)))
