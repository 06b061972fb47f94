"""GPU-hour accounting: what an attempt cost, by the job's own clock and by the scheduler's.

allocated GPU-hours = nodes x GPUs per node x elapsed_seconds / 3600, from allocation start to end
(through evaluation); queue time is never GPU time. `allocated_gpus` is the allocation's whole GPU
count (what Slurm's AllocTRES gres/gpu reports), `gpu_hours` its cost over some seconds. The ledger keeps both figures; they must agree.
This module is the one home of that formula and of what "disagree" means.
"""

from __future__ import annotations

from collections.abc import Iterable

# The job's own figure and the scheduler's differ by more than this: flagged in status.
DISAGREEMENT_FRACTION = 0.01
# What the cost view (`ggpo-batch costs --by`, the dashboard's cost page) groups booked GPU-hours by.
COST_GROUPS = ("user", "experiment", "queue", "month")


def allocated_gpus(nodes: int, gpus_per_node: int) -> int:
    """The GPUs an allocation of `nodes` nodes holds: nodes x GPUs per node."""
    return nodes * gpus_per_node


def gpu_hours(gpus: int, seconds: float) -> float:
    """Allocated GPU-hours: gpus (the whole allocation's, `allocated_gpus`) x seconds / 3600."""
    return gpus * seconds / 3600.0


def disagreement(job: float | None, scheduler: float | None) -> float | None:
    """|scheduler - job| / scheduler (the scheduler's figure bills), or None when either is missing."""
    if job is None or scheduler is None:
        return None
    if scheduler == 0:
        return 0.0 if job == 0 else float("inf")
    return abs(scheduler - job) / abs(scheduler)


def disagrees(job: float | None, scheduler: float | None) -> bool:
    """True when both figures exist and differ by more than DISAGREEMENT_FRACTION."""
    d = disagreement(job, scheduler)
    return d is not None and d > DISAGREEMENT_FRACTION


def disagrees_clause(job, scheduler):  # type: ignore[no-untyped-def]
    """`disagrees` as a SQL condition on two columns (for queries that must not load every row)."""
    from sqlalchemy import and_, func

    # |s - j| > f |s|: with s = 0 that is j != 0, as `disagreement` says (infinite).
    return and_(job.is_not(None), scheduler.is_not(None),
                func.abs(scheduler - job) > DISAGREEMENT_FRACTION * func.abs(scheduler))


def attempt_gpu_hours(job: float | None, scheduler: float | None) -> float | None:
    """The figure to book: the scheduler's when it has one (it bills), else the job's own."""
    return scheduler if scheduler is not None else job


def total(values: Iterable[float | None]) -> float:
    return float(sum(v for v in values if v is not None))
