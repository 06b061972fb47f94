"""Reconcile cost against a real Slurm: one batched sacct call per cycle vs one sacct call per job.

For 1, 10 and 100 active (held, pending) jobs, measures sacct calls and seconds per reconcile
cycle both ways in the same run, and prints the per-job baseline's cost as a ratio of the batched
one. Needs the dev cluster (slurm/dev-cluster/up.sh); submits and then cancels its own jobs.

    PYTHONPATH=. python tools/bench/reconcile_sacct.py [--sizes 1,10,100] [--cycles 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

from ggpo_batch.executor.sacct import Sacct, run_command


def submit_held(n: int, tag: str) -> list[str]:
    ids = []
    for i in range(n):
        out = run_command(["sbatch", "--parsable", "--hold", "-t", "1", "--gpus-per-node=4",
                           "-J", f"ggpo.bench-{tag}-{i}.a0", "-o", "/dev/null", "--wrap", "true"])
        ids.append(out.strip().split(";")[0])
    return ids


def wait_visible(ids: list[str], timeout_s: float = 30) -> None:
    """slurmdbd records submissions a moment after sbatch: wait until sacct knows every id."""
    end = time.monotonic() + timeout_s
    while len(Sacct().accounts(ids)) < len(ids):
        if time.monotonic() > end:
            raise SystemExit(f"sacct did not show all {len(ids)} jobs within {timeout_s} s")
        time.sleep(0.5)


def cycle_batched(sacct: Sacct, ids: list[str]) -> float:
    t0 = time.perf_counter()
    got = sacct.accounts(ids)
    assert len(got) == len(ids)
    return time.perf_counter() - t0


def cycle_per_job(sacct: Sacct, ids: list[str]) -> float:
    t0 = time.perf_counter()
    for j in ids:
        assert j in sacct.accounts([j])
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,100")
    ap.add_argument("--cycles", type=int, default=5)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    tag = uuid.uuid4().hex[:8]
    ids = submit_held(max(sizes), tag)
    try:
        wait_visible(ids)
        print(f"{'jobs':>5} {'batched calls/cycle':>20} {'batched s/cycle':>16} "
              f"{'per-job calls/cycle':>20} {'per-job s/cycle':>16} {'ratio (per-job/batched s)':>26}")
        for n in sizes:
            active = ids[:n]
            batched, per_job = Sacct(), Sacct()
            tb = statistics.median(cycle_batched(batched, active) for _ in range(args.cycles))
            tp = statistics.median(cycle_per_job(per_job, active) for _ in range(args.cycles))
            print(f"{n:>5} {batched.calls / args.cycles:>20.0f} {tb:>16.4f} "
                  f"{per_job.calls / args.cycles:>20.0f} {tp:>16.4f} {tp / tb:>25.1f}x")
    finally:
        for i in range(0, len(ids), 500):
            run_command(["scancel", *ids[i:i + 500]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
