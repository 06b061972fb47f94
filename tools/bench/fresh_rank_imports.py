"""Benchmark: a rank started as its own interpreter (a Slurm task, an in-process job), to its ZeRO-2
engine, with DeepSpeed's Muon optimizer imported as DeepSpeed imports it (the baseline: compiled,
which imports torch._inductor) and as `train.policy.deepspeed_import` imports it now (uncompiled).

Each leg starts REPEAT interpreters one after another, interleaved, each doing what a rank does
before its first step (`tools/bench/rank_time_imports.rank_start`), and sums their CPU-seconds
(their own rusage). Nothing else should run on the machine.

    .venv/bin/python tools/bench/fresh_rank_imports.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import sys
if sys.argv[1] == "compiled":  # the baseline: the workaround off, Muon imported as DeepSpeed does
    import importlib
    from ggpo_batch.train.policy import deepspeed_import
    deepspeed_import._import_uncompiled = importlib.import_module
from tools.bench.rank_time_imports import rank_start
rank_start()
print("torch._inductor.compile_fx" in sys.modules)
"""


def one(mode: str) -> bool:
    """Start one rank; whether it imported torch._inductor."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"a {mode} rank failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout.strip().endswith("True")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="interpreters started in each leg")
    a = ap.parse_args()
    cpu = {"compiled": 0.0, "uncompiled": 0.0}
    inductor = {}
    for _ in range(a.repeat):
        for mode in cpu:
            before = os.times()
            inductor[mode] = one(mode)
            after = os.times()
            cpu[mode] += (after.children_user - before.children_user) + (after.children_system - before.children_system)
    c, u = cpu["compiled"] / a.repeat, cpu["uncompiled"] / a.repeat
    print(f"{a.repeat} fresh ranks a leg to a ZeRO-2 engine: {c:.2f} CPU-s a rank with DeepSpeed's Muon compiled "
          f"(torch._inductor imported: {inductor['compiled']}), {u:.2f} uncompiled (imported: "
          f"{inductor['uncompiled']}): {c - u:.2f} CPU-s less a rank, {c / u:.2f}x")


if __name__ == "__main__":
    main()
