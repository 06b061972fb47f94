"""GPU-hour accounting: what an attempt cost, by the job's own clock and by the scheduler's.

allocated GPU-hours = gpus x elapsed_seconds / 3600, from allocation start to end (through
evaluation); queue time is never GPU time. The ledger keeps both figures; they must agree.
"""

from __future__ import annotations

from typing import Iterable

from .run_record import gpu_hours

__all__ = ["gpu_hours", "DISAGREEMENT_FRACTION", "disagrees", "attempt_gpu_hours", "total"]

# The job's own figure and the scheduler's differ by more than this: flagged in status.
DISAGREEMENT_FRACTION = 0.01


def disagrees(job: float | None, scheduler: float | None) -> bool:
    """True when both figures exist and differ by more than 1 % of the larger."""
    if job is None or scheduler is None:
        return False
    top = max(abs(job), abs(scheduler))
    return top > 0 and abs(job - scheduler) / top > DISAGREEMENT_FRACTION


def attempt_gpu_hours(job: float | None, scheduler: float | None) -> float | None:
    """The figure to book: the scheduler's when it has one (it bills), else the job's own."""
    return scheduler if scheduler is not None else job


def total(values: Iterable[float | None]) -> float:
    return float(sum(v for v in values if v is not None))
