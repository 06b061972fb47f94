#!/usr/bin/env python3
"""Benchmark: the 3-seed nightly CPU tier (l1_mechanism, ggpo) end to end, in fresh processes.

Figure: wall seconds of a fresh process that imports the tier and runs it (seeds 42-44, the
suite's budgets and corpus), as a ratio against a baseline measured in the same run: a fresh
process that only imports the same modules (interpreter + torch start-up, which no tier can
avoid). Also printed: the record's own timing.tier_seconds against the 60 s goal. Median of
--repeat runs each, interleaved so that load from other users hits both alike.

    PYTHONPATH=$PWD .venv/bin/python tools/bench/nightly_tier.py --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMPORT_ONLY = "import ggpo_batch.nightly.runner"
RUN = (
    "import json, ggpo_batch.nightly.runner as n\n"
    "r = n.run_nightly(seeds=[42, 43, 44], methods=['ggpo'], corpus=None, corpus_sha256=None, output=None,"
    " command='tools/bench/nightly_tier.py')\n"
    "print(json.dumps({'timing': r['timing'], 'dataset': r['dataset']['id'],"
    " 'checks': r['execution_checks']}))\n"
)


def _timed(code: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, out.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    base, full, tier = [], [], []
    info: dict = {}
    for _ in range(args.repeat):
        base.append(_timed(IMPORT_ONLY)[0])
        seconds, out = _timed(RUN)
        full.append(seconds)
        info = json.loads(out.strip().splitlines()[-1])
        tier.append(info["timing"]["tier_seconds"])
    b, f, t = statistics.median(base), statistics.median(full), statistics.median(tier)
    goal = info["timing"]["time_goal_seconds"]
    print(f"corpus: {info['dataset']}; torch threads {info['timing']['torch_threads']}; repeats {args.repeat}")
    print(f"baseline (fresh process, imports only):      {b:7.2f} s")
    print(f"3-seed tier (fresh process, import + run):   {f:7.2f} s  = {f / b:5.2f} x baseline")
    print(f"record timing.tier_seconds (run only):       {t:7.2f} s  = {t / goal:5.3f} of the {goal:.0f} s goal")
    print(f"end to end against the goal:                 {f / goal:5.3f} of {goal:.0f} s "
          f"({'within' if f < goal else 'OVER'} the goal)")
    return 0 if f < goal else 1


if __name__ == "__main__":
    raise SystemExit(main())
