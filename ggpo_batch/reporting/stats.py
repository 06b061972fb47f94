"""The report's statistics, in one place: mean, sample std, n and a 95 % confidence interval of the
mean; the same for differences paired by seed, and for two independent groups (`report A B`).

Which interval, when, and why:

- 2 <= n < BOOTSTRAP_MIN_N (30): Student's t interval, mean +- t(0.975, n-1) s / sqrt(n). With a
  handful of seeds the bootstrap only resamples the few values it has (for n = 3, ten distinct
  resamples; the resampled means spread by sqrt((n-1)/n) of the standard error), and its intervals
  are too narrow. Measured (1,500 simulated samples each, tools/bench/ci_coverage.py): a nominal
  95 % BCa interval covered the true mean 72 / 83 / 89 / 94 % of the time at n = 3 / 5 / 10 / 20 for
  normal values, 68 / 78 / 86 / 90 % for skewed (log-normal) ones; the t interval 95 / 94 / 95 / 96 %
  and 90 / 88 / 89 / 91 %. The t interval assumes the per-seed values (or differences) are roughly
  normal; with a few seeds nothing does better, and it is honestly wide (t(0.975, 2) = 4.30).
- n >= 30: the BCa bootstrap over the values (`scipy.stats.bootstrap`, 9,999 resamples, a fixed
  seed so the same ledger gives the same report). There the two methods agree on normal values
  (94.5 vs 96 %) and on skewed ones (92 vs 92 %), and the bootstrap assumes no shape.
- n < 2: no interval (None); a constant sample gets the degenerate interval [mean, mean].

Every summary says which method it used (`ci95_method`: "t", "bootstrap_bca" or None).
Pure functions of plain numbers; scipy is imported on first use only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

LEVEL = 0.95
BOOTSTRAP_MIN_N = 30
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 20261012
METHOD_T = "t"
METHOD_BOOTSTRAP = "bootstrap_bca"
METHOD_WELCH = "welch_t"


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom (t_{(1+level)/2, df})."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def t_interval(xs: list[float], level: float = LEVEL) -> tuple[float, float]:
    """mean +- t_{(1+level)/2, n-1} s / sqrt(n) (n >= 2)."""
    n = len(xs)
    mean = math.fsum(xs) / n
    half = t_quantile(n - 1, level) * statistics.stdev(xs) / math.sqrt(n)
    return mean - half, mean + half


def bootstrap_interval(xs: list[float], level: float = LEVEL, *, seed: int = BOOTSTRAP_SEED,
                       resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The BCa bootstrap interval of the mean (scipy.stats.bootstrap, seeded)."""
    import numpy as np
    from scipy.stats import bootstrap

    res = bootstrap((np.asarray(xs, dtype=float),), np.mean, confidence_level=level, n_resamples=resamples,
                    method="BCa", rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def interval(xs: list[float], level: float = LEVEL) -> tuple[tuple[float, float] | None, str | None]:
    """(low, high) of the mean of `xs` and the method used (module docstring); (None, None) for n < 2."""
    n = len(xs)
    if n < 2:
        return None, None
    mean = math.fsum(xs) / n
    if max(xs) == min(xs):
        return (mean, mean), METHOD_T
    if n >= BOOTSTRAP_MIN_N:
        lo, hi = bootstrap_interval(xs, level)
        if math.isfinite(lo) and math.isfinite(hi):
            return (lo, hi), METHOD_BOOTSTRAP
    return t_interval(xs, level), METHOD_T


def summary(values: Iterable[float]) -> dict[str, Any]:
    """{"mean", "std", "n", "ci95": [low, high] | None, "ci95_method"}: fsum mean, sample std (n - 1)."""
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(xs)
    if n == 0:
        return {"mean": None, "std": None, "n": 0, "ci95": None, "ci95_method": None}
    ci, method = interval(xs)
    return {"mean": math.fsum(xs) / n, "std": statistics.stdev(xs) if n > 1 else None, "n": n,
            "ci95": list(ci) if ci else None, "ci95_method": method}


def paired(a: Mapping[Any, float | None], b: Mapping[Any, float | None]) -> dict[str, Any]:
    """a - b over the keys (seeds) both have a value for: the summary of the differences, the
    per-key differences (`per_seed`, keys as strings) and the keys only one side has (`unpaired`)."""
    keys = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    per = {str(k): float(a[k]) - float(b[k]) for k in keys}  # type: ignore[arg-type]
    unpaired = sorted(str(k) for k in set(a) ^ set(b))
    return {**summary(per.values()), "per_seed": per, "unpaired": unpaired}


def welch(a: Iterable[float], b: Iterable[float], level: float = LEVEL) -> dict[str, Any]:
    """mean(b) - mean(a) of two independent groups with Welch's t interval (unequal variances;
    Welch-Satterthwaite degrees of freedom); no interval unless each side has >= 2 values."""
    xa = [float(v) for v in a if v is not None]
    xb = [float(v) for v in b if v is not None]
    if not xa or not xb:
        return {"mean": None, "ci95": None, "ci95_method": None, "n": [len(xa), len(xb)]}
    diff = math.fsum(xb) / len(xb) - math.fsum(xa) / len(xa)
    out: dict[str, Any] = {"mean": diff, "ci95": None, "ci95_method": None, "n": [len(xa), len(xb)]}
    if len(xa) < 2 or len(xb) < 2:
        return out
    va, vb = statistics.variance(xa) / len(xa), statistics.variance(xb) / len(xb)
    se = math.sqrt(va + vb)
    if se == 0:
        out.update(ci95=[diff, diff], ci95_method=METHOD_WELCH)
        return out
    df = (va + vb) ** 2 / (va**2 / (len(xa) - 1) + vb**2 / (len(xb) - 1))
    half = t_quantile(df, level) * se
    out.update(ci95=[diff - half, diff + half], ci95_method=METHOD_WELCH, df=df)
    return out


def excludes_zero(st: Mapping[str, Any] | None) -> bool | None:
    """Whether a summary's interval lies wholly on one side of 0 (None without an interval)."""
    ci = (st or {}).get("ci95")
    if not ci:
        return None
    return ci[0] > 0 or ci[1] < 0
