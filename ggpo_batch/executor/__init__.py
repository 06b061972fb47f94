"""Executors: where a run's allocation comes from (slurm, local, debug), behind one interface.

`EXECUTORS` is the one registry: spec validation and the CLI read its names, `make_executor`
builds from it. Backends are imported only when built (submitit, Slurm tools are not needed to
read a spec).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..errors import ExecutorError
from .base import Executor, JobAccount, JobInfo, job_name

__all__ = ["EXECUTORS", "EXECUTOR_NAMES", "IN_PROCESS_EXECUTORS", "Executor", "JobAccount", "JobInfo", "job_name", "make_executor"]


def _debug(jobs_dir: Path, profile: str, profile_dirs: Sequence[Path] | None, local_tasks: int, redis_url: str | None) -> Executor:
    from .debug import DebugExecutor

    return DebugExecutor()


def _local(jobs_dir: Path, profile: str, profile_dirs: Sequence[Path] | None, local_tasks: int, redis_url: str | None) -> Executor:
    from .local import LocalExecutor

    return LocalExecutor(jobs_dir, tasks=local_tasks)


def _slurm(jobs_dir: Path, profile: str, profile_dirs: Sequence[Path] | None, local_tasks: int, redis_url: str | None) -> Executor:
    try:
        from .pacing import make_bucket
        from .profile import load_profile
        from .slurm import SlurmExecutor
    except ImportError as exc:  # pragma: no cover - submitit missing from the environment
        raise ExecutorError(f"the slurm executor is unavailable: {exc}") from None
    prof = load_profile(profile, profile_dirs)
    return SlurmExecutor(prof, jobs_dir, pacer=make_bucket(prof.pace, redis_url=redis_url))


EXECUTORS: Mapping[str, Callable[[Path, str, Sequence[Path] | None, int, str | None], Executor]] = {
    "slurm": _slurm, "local": _local, "debug": _debug}
EXECUTOR_NAMES = tuple(EXECUTORS)
# Executors whose attempt trains on the submitting host, in a process forked from the worker for
# it (the others hand it to a scheduler).
IN_PROCESS_EXECUTORS = frozenset({"debug"})


def make_executor(name: str, *, jobs_dir: Path, profile: str = "default", profile_dirs: Sequence[Path] | None = None,
                  local_tasks: int = 2, redis_url: str | None = None) -> Executor:
    """The executor backend `name` (one of EXECUTOR_NAMES); the Slurm executor's `profile` is looked up
    in `profile_dirs` (default: the search path of `datafiles`); with `redis_url` its sbatch pacing
    bucket is shared in that Redis by every worker of the user."""
    factory = EXECUTORS.get(name)
    if factory is None:
        raise ExecutorError(f"unknown executor {name!r} ({', '.join(EXECUTOR_NAMES)})")
    return factory(Path(jobs_dir), profile, profile_dirs, local_tasks, redis_url)
