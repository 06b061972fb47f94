"""Small callables the Slurm tests run inside allocations.

They are not in an installed module, so the allocation could not import them: this module registers
itself with cloudpickle to be shipped by value."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cloudpickle


def sleep_then_report(seconds: float, out: str) -> str:
    """Sleep, then write what the allocation looked like."""
    time.sleep(seconds)
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    Path(out).write_text(f"{cvd}\n{os.environ.get('SLURM_JOB_ID', '')}\n{os.environ.get('MASTER_PORT', '')}\n")
    return cvd


class CountingSleeper:
    """Rank 0 appends one line per start to `log`, then all ranks sleep: a requeued job has two lines.

    `first_seconds` (default `seconds`) is the first start's sleep: a test that preempts the first
    run gives it room, since submitit's handler takes seconds to requeue on a loaded machine and a
    run that ends first is never requeued."""

    def __init__(self, seconds: float, log: str, first_seconds: float | None = None) -> None:
        self.seconds = seconds
        self.first_seconds = seconds if first_seconds is None else first_seconds
        self.log = log

    def __call__(self) -> int:
        first = not Path(self.log).exists()
        if os.environ.get("SLURM_PROCID", "0") == "0":
            with open(self.log, "a") as f:
                f.write(f"start {os.environ.get('SLURM_JOB_ID', '')} {time.time():.1f}\n")
        time.sleep(self.first_seconds if first else self.seconds)
        return len(Path(self.log).read_text().splitlines())


cloudpickle.register_pickle_by_value(sys.modules[__name__])
