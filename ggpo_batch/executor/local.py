"""The `local` executor: submitit's LocalExecutor on this machine, N CPU ranks per run.

A local job's id is its submitit controller's PID. The folder of each job is recorded in an
index beside the job folders, so another process (reconcile, a restarted worker) can find and
poll it; a job whose process is gone without a result file is reported LOST.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import submitit

from ..common import metrics, rank_client
from ..common.netutil import free_port
from ..common.rank_client import alive
from ..contracts.allocation import alloc_start_export, record_path, vllm_cache_export
from ..contracts.canary_spec import CanarySpec
from ..contracts.evaluation_spec import EvaluationSpec
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec
from ..errors import ExecutorError
from . import forked
from .base import Executor, JobInfo
from .payload import make_payload


def _mtime(p: Path) -> datetime | None:
    try:
        return datetime.fromtimestamp(p.stat().st_mtime, tz=UTC)
    except OSError:
        return None


class LocalExecutor(Executor):
    """Runs each attempt as a local submitit job with `tasks` ranks (2 CPU ranks by default)."""

    name = "local"

    def __init__(self, jobs_dir: Path, *, tasks: int = 2, timeout_min: float = 24 * 60) -> None:
        self.jobs_dir = Path(jobs_dir)
        self.tasks = tasks
        self.timeout_min = timeout_min
        self._index = self.jobs_dir / ".local-index"
        self._jobs: dict[str, object] = {}  # job id -> submitit LocalJob, for this process's own jobs

    def _marker(self, folder: Path) -> Path:
        return folder / "job_id"

    def submit(self, spec: RunSpec | EvaluationSpec, attempt: int, folder: Path, *, lookup: bool = True,
               priority: str = DEFAULT_PRIORITY) -> str:
        existing = self.find(spec, attempt, folder)
        if existing is not None:
            return existing
        folder.mkdir(parents=True, exist_ok=True)
        if forked.in_worker():  # the controller an orphan of its own group, not the worker's child
            job_id = forked.call_forked(lambda: self._start(spec, folder)[0], own_group=True)
        else:
            job_id, job = self._start(spec, folder)
            self._jobs[job_id] = job
        self._index.mkdir(parents=True, exist_ok=True)
        (self._index / job_id).write_text(str(folder))
        tmp = self._marker(folder).with_suffix(".tmp")
        tmp.write_text(job_id)
        tmp.replace(self._marker(folder))
        return job_id

    def _start(self, spec: RunSpec | EvaluationSpec, folder: Path) -> tuple[str, object]:
        """Start submitit's controller for the run: (its job id, the submitit LocalJob)."""
        # Each rank forked by the machine's rank server, its imports done once (rank_client.py).
        ex = submitit.LocalExecutor(folder=folder, python=rank_client.command() if rank_client.enabled() else None)
        # The controller's shell exports the start time, so the job's clock starts with the "allocation".
        # A free rendezvous port chosen now: submitit's default draws one from the job id, which
        # collided (EADDRINUSE) with a port still held on this machine.
        # An evaluation after training runs one rank per GPU it asked for (CPU ranks here).
        # A canary is one process (train/run/canary.py).
        tasks = spec.gpus if isinstance(spec, EvaluationSpec) else 1 if isinstance(spec, CanarySpec) else self.tasks
        ex.update_parameters(tasks_per_node=tasks, timeout_min=self.timeout_min, gpus_per_node=0,
                             setup=[alloc_start_export("$(date +%s.%N)"), f"export MASTER_PORT={free_port()}",
                                    vllm_cache_export(self.jobs_dir),
                                    metrics.UNSET_FOR_JOBS])
        job = ex.submit(make_payload(spec, record_path(folder)))
        return str(job.job_id), job

    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        if folder is None:
            return None
        marker = self._marker(folder)
        return marker.read_text().strip() if marker.exists() else None

    def folder_of(self, job_id: str) -> Path | None:
        p = self._index / job_id
        return Path(p.read_text()) if p.exists() else None

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        return {j: self._poll_one(j) for j in job_ids}

    def _poll_one(self, job_id: str) -> JobInfo:
        folder = self.folder_of(job_id)
        if folder is None:
            return JobInfo(job_id=job_id, state="LOST", exit_code="unknown local job")
        result = folder / f"{job_id}_0_result.pkl"
        start = _mtime(folder / f"{job_id}_submitted.pkl")
        if result.exists():
            end = _mtime(result)
            try:
                outcome, _value = pickle.loads(result.read_bytes())
            except Exception:  # a torn write: the process died while writing
                outcome = "error"
            elapsed = (end - start).total_seconds() if start and end else None
            state = "COMPLETED" if outcome == "success" else "FAILED"
            return JobInfo(job_id=job_id, state=state, start=start, end=end, elapsed_seconds=elapsed,
                           exit_code="0" if state == "COMPLETED" else "1")
        job = self._jobs.get(job_id)
        if job is not None:
            running = job.state == "RUNNING"  # type: ignore[attr-defined]
        else:
            running = job_id.isdigit() and alive(int(job_id))
        if running:
            return JobInfo(job_id=job_id, state="RUNNING", start=start)
        return JobInfo(job_id=job_id, state="LOST", start=start, exit_code="process ended without a result")

    def cancel(self, job_id: str) -> None:
        job = self._jobs.get(job_id)
        if job is not None:
            job.cancel()  # type: ignore[attr-defined]
            return
        if job_id.isdigit() and alive(int(job_id)):
            import signal

            try:
                os.kill(int(job_id), signal.SIGINT)
            except ProcessLookupError:
                pass
            return
        if self.folder_of(job_id) is None:
            raise ExecutorError(f"local job {job_id} is unknown")
