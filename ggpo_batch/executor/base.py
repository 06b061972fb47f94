"""The executor interface. A backend takes a run spec + attempt number and returns a job handle;
state is polled for many jobs at once (one call per cycle, never one per job)."""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..contracts.accounting import gpu_hours
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec

if TYPE_CHECKING:
    from ..contracts.evaluation_spec import EvaluationSpec
from ..contracts.states import SCHEDULER_FINAL

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_name(run_key: str, attempt: int) -> str:
    """The scheduler-visible name of an attempt; it lets a submission be found again."""
    return _SAFE.sub("_", f"ggpo.{run_key}.a{attempt}")[:200]


@dataclass(frozen=True)
class JobInfo:
    """What the scheduler says about one job."""

    job_id: str
    state: str  # PENDING, RUNNING, or one of states.SCHEDULER_FINAL
    start: datetime | None = None
    end: datetime | None = None
    elapsed_seconds: float | None = None
    alloc_gpus: int | None = None
    exit_code: str | None = None
    restarts: int = 0

    @property
    def final(self) -> bool:
        return self.state in SCHEDULER_FINAL

    @property
    def gpu_hours(self) -> float | None:
        if self.alloc_gpus is None or self.elapsed_seconds is None:
            return None
        return gpu_hours(self.alloc_gpus, self.elapsed_seconds)


@dataclass(frozen=True)
class JobAccount:
    """Everything the scheduler knows about one job: its latest state and every run (segment) it
    had. Slurm requeues a job under the same id; each run is a segment the ledger books as its own
    attempt. Backends that never requeue have one segment, the job itself."""

    latest: JobInfo
    segments: tuple[JobInfo, ...]
    name: str = ""
    comments: tuple[str, ...] = ()

    @property
    def gpu_hours(self) -> float | None:
        """Allocated GPU-hours summed over all runs of the job (requeues included)."""
        hours = [s.gpu_hours for s in self.segments if s.gpu_hours is not None]
        return sum(hours) if hours else None


class Executor(abc.ABC):
    """Submits attempts of runs and reports their state."""

    name: str

    @abc.abstractmethod
    def submit(self, spec: RunSpec | EvaluationSpec, attempt: int, folder: Path, *, lookup: bool = True,
               priority: str = DEFAULT_PRIORITY) -> str:
        """Start the attempt (of a run, or of an evaluation after training); return the scheduler's job id.
        Must not submit twice for one (run, attempt):
        with `lookup` it first looks for one; `lookup=False` is for a caller that has just created the
        attempt (no job can exist for it yet), so the scheduler is not queried once per submission.
        `priority` (the run's, priorities.py): a scheduler that has priorities maps it onto its own."""

    @abc.abstractmethod
    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        """The job id of an already-submitted (run, attempt), if the scheduler knows one.

        `folder` is the attempt's folder (backends without a scheduler keep their marker there)."""

    @abc.abstractmethod
    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """The state of many jobs in one query."""

    def accounts(self, job_ids: Iterable[str]) -> dict[str, JobAccount]:
        """`poll` with every run of each job; a backend that requeues under one id overrides it."""
        return {j: JobAccount(latest=info, segments=(info,)) for j, info in self.poll(job_ids).items()}

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel a pending or running job."""

    def wait_final(self, job_id: str, *, max_delay: float = 10.0) -> JobInfo:
        """Poll one job until the scheduler reports a final state (backing off up to `max_delay` s)."""
        delay = 0.2
        while True:
            info = self.poll([job_id])[job_id]
            if info.final:
                return info
            time.sleep(delay)
            delay = min(delay * 2, max_delay)
