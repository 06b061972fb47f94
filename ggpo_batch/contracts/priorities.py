"""Run priorities: the one home of their names, their order, and the RQ queue each waits on.

A run's priority is stored in the ledger (`runs.priority`, set by `enqueue --priority` or the spec's
`[experiment] priority`), so reconcile rebuilds Redis with it. On Redis each ggpo-batch queue is one
RQ queue per priority: the normal one keeps the queue's own name (what a queue held before
priorities existed), the others add a suffix no queue name can contain (names are letters, digits,
`_` and `-`). A worker listens on them highest first, and RQ's default dequeue takes the first
queue, in the order given, that has a job: a high run waiting anywhere is taken before any normal one.
On Slurm a profile maps each priority to `--nice` and/or a QoS (executor/profile.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

HIGH, NORMAL, LOW = "high", "normal", "low"
PRIORITIES: tuple[str, ...] = (HIGH, NORMAL, LOW)  # highest first
DEFAULT_PRIORITY = NORMAL
PRIORITY_COLUMN_LENGTH = 8  # runs.priority


def priority_problem(value: Any) -> str | None:
    """Why `value` is not a priority (None: it is one)."""
    if value in PRIORITIES:
        return None
    return f"must be one of {', '.join(PRIORITIES)}, got {value!r}"


def rq_queue_name(queue: str, priority: str) -> str:
    """The RQ queue that holds `queue`'s runs of `priority`."""
    return queue if priority == NORMAL else f"{queue}:{priority}"


def queue_of(rq_name: str) -> str:
    """The queue an RQ queue of `rq_queue_name` belongs to."""
    name, _, priority = rq_name.rpartition(":")
    return name if name and priority in PRIORITIES else rq_name


def worker_queue_names(queues: Sequence[str]) -> list[str]:
    """The RQ queues a worker of `queues` listens on, in the order it takes work: every queue's high
    runs, then their normal runs, then their low ones."""
    return [rq_queue_name(q, p) for p in PRIORITIES for q in queues]


def rank(priority: str) -> int:
    """0 for the highest priority: a sort key."""
    return PRIORITIES.index(priority)


def by_priority(keys_priorities: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Run keys grouped by priority, highest first, each group in the order given."""
    out: dict[str, list[str]] = {p: [] for p in PRIORITIES}
    for key, priority in keys_priorities:
        out[priority if priority in out else DEFAULT_PRIORITY].append(key)
    return {p: keys for p, keys in out.items() if keys}
