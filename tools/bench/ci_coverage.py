#!/usr/bin/env python3
"""Coverage of the report's 95 % intervals (ggpo_batch/reporting/stats.py): how often the BCa
bootstrap and the t interval contain the true mean, by number of seeds, for normal and for skewed
(log-normal, sigma 0.75) values. The figures in stats.py's docstring and docs/researcher.md come from

    .venv/bin/python tools/bench/ci_coverage.py --reps 1500

(about 3 minutes on 2 cores). A nominal 95 % interval should cover about 95 % of the time.
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from scipy.stats import bootstrap, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1500)
    ap.add_argument("--sizes", default="3,5,10,20,30")
    ap.add_argument("--resamples", type=int, default=1999)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    rng = np.random.default_rng(1)
    print(f"{'values':<10} {'n':>3} {'BCa':>6} {'t':>6}   ({args.reps} samples each)")
    for dist in ("normal", "lognormal"):
        for n in (int(x) for x in args.sizes.split(",")):
            cb = ct = 0
            for _ in range(args.reps):
                if dist == "normal":
                    x, mu = rng.normal(size=n), 0.0
                else:
                    x, mu = rng.lognormal(0, 0.75, size=n), float(np.exp(0.75**2 / 2))
                r = bootstrap((x,), np.mean, n_resamples=args.resamples, method="BCa", rng=rng).confidence_interval
                cb += r.low <= mu <= r.high
                half = t.ppf(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n)
                ct += abs(x.mean() - mu) <= half
            print(f"{dist:<10} {n:>3} {cb / args.reps:>6.3f} {ct / args.reps:>6.3f}", flush=True)


if __name__ == "__main__":
    main()
