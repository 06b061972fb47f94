"""Seeds added in waves with honest error control: Lan-DeMets alpha-spending with exact t boundaries.

Looking after every wave at the fixed test's level inflates the false-positive rate (looks at 3, 5,
7, 10 seeds: about 0.14 at a nominal 0.05). A group-sequential design spends alpha over the looks
instead: with waves n_1 < ... < n_K and information fraction t_k = n_k / n_K, a spending function
alpha(t) (two-sided; R gsDesign's sfLDOF / sfLDPocock)

    O'Brien-Fleming type: alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))
    Pocock type:          alpha(t) = alpha ln(1 + (e - 1) t)

and look k rejects when |T_k| >= c_k, with c_k such that P_0(first crossing at look k) =
alpha(t_k) - alpha(t_{k-1}). The classical boundaries are z (known variance), wrong at 3 seeds. Under
normal differences the joint null law of (T_{n_1}, ..., T_{n_K}) does not depend on sigma (T is scale
free), so the t boundaries are calibrated exactly by simulating sigma = 1: the first from Student's t
itself, each later one as the quantile of |T_k| over the paths that have not crossed yet. No
maintained Python package does this (design note: docs/researcher.md, "How many seeds"); it is tested
by simulation (tests/test_power.py). The draws are seeded: a design's boundaries are the same every time.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

SPENDING = ("obrien-fleming", "pocock")
PATHS = 200_000  # simulated null paths per calibration: about a second on one core for 4 looks
SEED = 20261012


def spent(t: float, alpha: float, kind: str = "obrien-fleming") -> float:
    """alpha(t): the two-sided alpha spent by information fraction t in [0, 1]."""
    from scipy.stats import norm

    if t <= 0:
        return 0.0
    t = min(t, 1.0)
    if kind == "obrien-fleming":
        return float(2 - 2 * norm.cdf(norm.isf(alpha / 2) / math.sqrt(t)))
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    raise ValueError(f"spending {kind!r}: one of {', '.join(SPENDING)}")


def check_waves(waves: Sequence[int]) -> str | None:
    """What is wrong with a wave schedule (None: nothing): integers >= 2, strictly increasing."""
    if not waves:
        return "must list at least one wave"
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 2 for w in waves):
        return "must be integers >= 2 (a look needs two seeds)"
    if any(b <= a for a, b in itertools.pairwise(waves)):
        return "must be strictly increasing"
    return None


def _statistics(waves: Sequence[int], paths: int, seed: int, shift: float = 0.0) -> Iterator[tuple[int, object]]:
    """(n_k, T at n_k for every path) per look: normal differences with mean `shift`, sd 1, drawn
    wave by wave (memory: paths x one wave's seeds)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    total = np.zeros(paths)
    squares = np.zeros(paths)
    done = 0
    for n in waves:
        x = rng.standard_normal((paths, n - done)) + shift
        total += x.sum(axis=1)
        squares += (x * x).sum(axis=1)
        done = n
        mean = total / n
        var = np.maximum(squares - n * mean * mean, 0.0) / (n - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            yield n, mean / np.sqrt(var / n)


def boundaries(waves: Sequence[int], alpha: float, kind: str = "obrien-fleming", *, paths: int = PATHS,
               seed: int = SEED) -> list[float]:
    """|t| boundaries c_1..c_K of a Lan-DeMets design (inf: that look cannot reject; its alpha is too
    small to resolve with `paths`, or it is 0). The same design is calibrated once per process."""
    return list(_boundaries(tuple(waves), alpha, kind, paths, seed))


@functools.lru_cache(maxsize=32)
def _boundaries(waves: tuple[int, ...], alpha: float, kind: str, paths: int, seed: int) -> tuple[float, ...]:
    import numpy as np
    from scipy.stats import t as student

    problem = check_waves(waves)
    if problem:
        raise ValueError(f"waves {list(waves)}: {problem}")
    out: list[float] = []
    alive = np.ones(paths, dtype=bool)
    before = 0.0
    for k, (n, stat) in enumerate(_statistics(waves, paths, seed)):
        now = spent(n / waves[-1], alpha, kind)
        inc = max(0.0, now - before)
        before = now
        if k == 0:  # exact: T_1 is Student's t with n_1 - 1 df
            c = float(student.isf(inc / 2, n - 1)) if inc > 0 else math.inf
        else:
            z = np.where(alive, np.abs(np.nan_to_num(stat, nan=0.0)), 0.0)
            c = math.inf if inc * paths < 1 else float(np.quantile(z, 1 - inc, method="higher"))
        out.append(c)
        alive &= ~(np.abs(stat) >= c)
    return tuple(out)


@dataclass(frozen=True)
class Operating:
    """What a sequential design does at one true effect, by simulation."""

    rejects: float  # P(some look crosses its boundary)
    expected_seeds: float  # E[seeds used]: the look it stops at, else the last wave
    se: float  # the simulation's standard error of `rejects`


def operating(waves: Sequence[int], bounds: Sequence[float], dz: float, *, paths: int = 40_000,
              seed: int = SEED + 1) -> Operating:
    """Rejection rate and expected seeds of looks at `waves` with |t| boundaries `bounds` when the
    true standardized effect is `dz` (0: the false-positive rate)."""
    import numpy as np

    stopped = np.zeros(paths, dtype=bool)
    seeds = np.full(paths, float(waves[-1]))
    for (n, stat), c in zip(_statistics(waves, paths, seed, dz), bounds):
        cross = ~stopped & (np.abs(np.nan_to_num(stat, nan=0.0)) >= c)
        seeds[cross] = n
        stopped |= cross
    p = float(stopped.mean())
    return Operating(p, float(seeds.mean()), math.sqrt(max(p * (1 - p), 1e-12) / paths))


def naive(waves: Sequence[int], alpha: float) -> list[float]:
    """The boundaries of looking after every wave at the fixed test's level (not a valid design)."""
    from scipy.stats import t as student

    return [float(student.isf(alpha / 2, n - 1)) for n in waves]


def futile(diffs: Sequence[float], last: int, final_boundary: float, threshold: float) -> bool:
    """Non-binding futility: the predictive probability that the last look (`last` seeds) crosses
    `final_boundary` is below `threshold` (ignoring it never raises alpha)."""
    from .power import predictive_success

    if threshold <= 0 or len(diffs) < 2:
        return False
    return predictive_success(diffs, max(0, last - len(diffs)), 0.05, critical=final_boundary) < threshold


@dataclass(frozen=True)
class Look:
    """Where one arm of a sequential design stands: the look its seeds reach, its statistic against
    that look's boundary, futility, and the seeds of the next wave."""

    look: int  # 1..looks; 0: not at the first wave yet
    looks: int
    seeds: int  # the seeds the look used: the first `waves[look - 1]` of the arm's differences
    t: float | None
    boundary: float | None  # None: this look cannot reject
    crossed: bool
    futile: bool
    next_wave: int | None  # the seeds of the next look; None after the last

    def as_dict(self) -> dict[str, object]:
        return {"look": self.look, "looks": self.looks, "seeds": self.seeds, "t": self.t, "boundary": self.boundary,
                "crossed": self.crossed, "futile": self.futile, "next_wave": self.next_wave}


def look(diffs: Sequence[float], waves: Sequence[int], bounds: Sequence[float], futility: float = 0.0) -> Look:
    """The look `diffs` (per-seed differences in seed order) have reached under waves and boundaries."""
    k = sum(1 for w in waves if w <= len(diffs))
    if k == 0:
        return Look(0, len(waves), len(diffs), None, None, False, False, waves[0])
    used = [float(d) for d in diffs[: waves[k - 1]]]
    n = len(used)
    mean = math.fsum(used) / n
    sd = math.sqrt(math.fsum((d - mean) ** 2 for d in used) / (n - 1))
    t = (mean / (sd / math.sqrt(n))) if sd > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
    c = bounds[k - 1]
    crossed = math.isfinite(c) and abs(t) >= c
    last = k == len(waves)
    stop_for_futility = not crossed and not last and futile(used, waves[-1], bounds[-1], futility)
    return Look(k, len(waves), n, t if math.isfinite(t) else None, c if math.isfinite(c) else None, crossed,
                stop_for_futility, None if last else waves[k])


def look_at(diffs: Sequence[float], k: int, waves: Sequence[int], bounds: Sequence[float],
            futility: float = 0.0) -> Look:
    """Look `k` (1-based) on the differences of the seeds of waves 1..k that were paired (in seed
    order; fewer than `waves[k-1]` when runs failed). A look short of its wave's seeds is computed
    but cannot reject or stop for futility: its boundary was calibrated for the full wave (not
    rejecting never raises alpha)."""
    if not 1 <= k <= len(waves):
        raise ValueError(f"look {k} of a design with {len(waves)} waves")
    used = [float(d) for d in diffs[: waves[k - 1]]]
    full = len(used) == waves[k - 1]
    c = bounds[k - 1]
    last = k == len(waves)
    if full:
        got = look(used, waves[:k], bounds[:k], 0.0)
        t, crossed = got.t, got.crossed
    elif len(used) >= 2:
        n = len(used)
        mean = math.fsum(used) / n
        sd = math.sqrt(math.fsum((d - mean) ** 2 for d in used) / (n - 1))
        t = (mean / (sd / math.sqrt(n))) if sd > 0 else (math.copysign(math.inf, mean) if mean else 0.0)
        t, crossed = (t if math.isfinite(t) else None), False
    else:
        t, crossed = None, False
    stop = full and not crossed and not last and futile(used, waves[-1], bounds[-1], futility)
    return Look(k, len(waves), len(used), t, c if math.isfinite(c) else None, crossed, stop,
                None if last else waves[k])
