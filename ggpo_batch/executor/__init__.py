"""Executors: where a run's allocation comes from (slurm, local, debug), behind one interface."""

from __future__ import annotations

from pathlib import Path

from ..errors import ExecutorError
from .base import Executor, JobInfo, job_name

__all__ = ["Executor", "JobInfo", "job_name", "make_executor"]


def make_executor(name: str, *, jobs_dir: Path, profile: str = "default", repo_dir: Path | None = None,
                  local_tasks: int = 2) -> Executor:
    """The executor backend `name` (slurm | local | debug)."""
    if name == "debug":
        from .debug import DebugExecutor

        return DebugExecutor()
    if name == "local":
        from .local import LocalExecutor

        return LocalExecutor(jobs_dir, tasks=local_tasks)
    if name == "slurm":
        try:
            from .profile import load_profile
            from .slurm import SlurmExecutor
        except ImportError as exc:  # pragma: no cover - until the slurm backend is installed
            raise ExecutorError(f"the slurm executor is unavailable: {exc}") from None
        search = (repo_dir or Path(__file__).resolve().parents[2]) / "slurm" / "profiles"
        return SlurmExecutor(load_profile(profile, search), jobs_dir)
    raise ExecutorError(f"unknown executor {name!r} (slurm, local, debug)")
