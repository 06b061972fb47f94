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
    Path(out).write_text(f"{cvd}\n{os.environ.get('SLURM_JOB_ID', '')}\n")
    return cvd


class CountingSleeper:
    """Rank 0 appends one line per start to `log`, then all ranks sleep: a requeued job has two lines."""

    def __init__(self, seconds: float, log: str) -> None:
        self.seconds = seconds
        self.log = log

    def __call__(self) -> int:
        if os.environ.get("SLURM_PROCID", "0") == "0":
            with open(self.log, "a") as f:
                f.write(f"start {os.environ.get('SLURM_JOB_ID', '')} {time.time():.1f}\n")
        time.sleep(self.seconds)
        return len(Path(self.log).read_text().splitlines())


cloudpickle.register_pickle_by_value(sys.modules[__name__])
