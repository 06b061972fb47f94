"""Benchmark: a local job's ranks started each on its own, against ranks forked by a rank server.

Runs JOBS local submitit jobs of TASKS ranks at once, as the local executor starts them (submitit's
controller, the command `ggpo_batch/executor/local.py` gives it), each rank doing what a training
or evaluation rank does first: import torch, DeepSpeed, transformers and the trainer
(`train.run.job.preload()`), then return. First the baseline, `GGPO_RANK_SERVER=off` (each rank
imports them itself, as before the server), then through a rank server started for this run (in a
folder of its own, so its own imports are in the figure), and prints each leg's wall time and the
machine's CPU time (`/proc/stat`: every process, the controllers and the server included), with the
ratios. Nothing else should run on the machine.

    .venv/bin/python tools/bench/local_ranks.py [--jobs 4] [--tasks 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import submitit

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ggpo_batch.common import rank_client  # noqa: E402


def machine_cpu_seconds() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:4]  # user, nice, system
    return sum(int(x) for x in fields) / os.sysconf("SC_CLK_TCK")


def _rank() -> int:
    from ggpo_batch.train.run.job import preload

    preload()
    return os.getpid()


def leg(folder: Path, jobs: int, tasks: int, *, server: bool) -> tuple[float, float]:
    """(wall seconds, machine CPU-seconds) of `jobs` local jobs of `tasks` ranks, started at once."""
    os.environ[rank_client.SWITCH] = "on" if server else "off"
    cpu, wall = machine_cpu_seconds(), time.perf_counter()
    running = []
    for j in range(jobs):
        ex = submitit.LocalExecutor(folder=folder / f"job-{j}", python=rank_client.command() if server else None)
        ex.update_parameters(tasks_per_node=tasks, timeout_min=30)
        running.append(ex.submit(_rank))
    for job in running:
        pids = job.results()
        assert len(set(pids)) == tasks, pids
    return time.perf_counter() - wall, machine_cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ggpo-bench-ranks-") as tmp:
        folder = Path(tmp)
        os.environ["XDG_RUNTIME_DIR"] = str(folder / "runtime")  # a rank server of this run's own
        (folder / "runtime").mkdir()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.chdir(REPO)
        base_wall, base_cpu = leg(folder / "alone", a.jobs, a.tasks, server=False)
        wall, cpu = leg(folder / "forked", a.jobs, a.tasks, server=True)
        for sock in (folder / "runtime").glob("*/*.sock"):
            for proc in Path("/proc").iterdir():
                try:
                    if str(sock).encode() in (proc / "cmdline").read_bytes():
                        os.kill(int(proc.name), signal.SIGTERM)
                except (OSError, ValueError):
                    pass
    print(f"local ranks: {a.jobs} jobs x {a.tasks} ranks, started at once")
    print(f"  each rank imports itself (GGPO_RANK_SERVER=off): {base_wall:6.1f} s wall {base_cpu:7.1f} CPU-s")
    print(f"  forked by a rank server (its imports included):  {wall:6.1f} s wall {cpu:7.1f} CPU-s")
    print(f"  ratio: CPU {base_cpu / cpu:.1f}x less, wall {base_wall / wall:.1f}x less")


if __name__ == "__main__":
    main()
