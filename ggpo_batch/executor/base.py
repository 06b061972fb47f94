"""The executor interface. A backend takes a run spec + attempt number and returns a job handle;
state is polled for many jobs at once (one call per cycle, never one per job)."""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable

from ..runspec import RunSpec

# Final states as Slurm names them; local/debug backends map onto the same vocabulary.
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
# Causes a spec may retry (`retries = N`): the infrastructure failed, not the training.
INFRASTRUCTURE_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "LOST"})

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_name(run_key: str, attempt: int) -> str:
    """The scheduler-visible name of an attempt; it lets a submission be found again."""
    return _SAFE.sub("_", f"ggpo.{run_key}.a{attempt}")[:200]


@dataclass(frozen=True)
class JobInfo:
    """What the scheduler says about one job."""

    job_id: str
    state: str  # PENDING, RUNNING, or one of FINAL_STATES
    start: datetime | None = None
    end: datetime | None = None
    elapsed_seconds: float | None = None
    alloc_gpus: int | None = None
    exit_code: str | None = None
    restarts: int = 0

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def gpu_hours(self) -> float | None:
        if self.alloc_gpus is None or self.elapsed_seconds is None:
            return None
        return self.alloc_gpus * self.elapsed_seconds / 3600.0


class Executor(abc.ABC):
    """Submits attempts of runs and reports their state."""

    name: str

    @abc.abstractmethod
    def submit(self, spec: RunSpec, attempt: int, folder: Path) -> str:
        """Start the attempt; return the scheduler's job id. Must not submit twice for one (run, attempt)."""

    @abc.abstractmethod
    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        """The job id of an already-submitted (run, attempt), if the scheduler knows one.

        `folder` is the attempt's folder (backends without a scheduler keep their marker there)."""

    @abc.abstractmethod
    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """The state of many jobs in one query."""

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job."""
