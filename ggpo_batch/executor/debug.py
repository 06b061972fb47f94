"""The `debug` executor: submitit's DebugExecutor, the run inside the calling process, one rank.

For tests and for stepping through a run with a debugger. `submit` returns after the run ended;
a debug job exists only in the process that ran it, so any other process polls it as LOST.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ..allocation import record_path
from ..runspec import RunSpec
from .base import Executor, JobInfo
from .payload import make_payload

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class DebugExecutor(Executor):
    name = "debug"

    def __init__(self) -> None:
        self._done: dict[str, JobInfo] = {}

    def submit(self, spec: RunSpec, attempt: int, folder: Path, *, lookup: bool = True) -> str:
        import submitit

        folder.mkdir(parents=True, exist_ok=True)
        job_id = f"debug-{int(time.time())}-{next(_ids)}"
        ex = submitit.DebugExecutor(folder=folder)
        start = datetime.now(UTC)
        t0 = time.monotonic()
        job = ex.submit(make_payload(spec, record_path(folder)))
        # exception() runs the job without DebugJob.results()'s post-mortem debugger prompt.
        exc = job.exception()
        elapsed = time.monotonic() - t0
        if exc is not None:
            log.error("debug job %s failed: %s", job_id, exc)
            (folder / "error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
        self._done[job_id] = JobInfo(
            job_id=job_id, state="FAILED" if exc else "COMPLETED", start=start,
            end=start + timedelta(seconds=elapsed), elapsed_seconds=elapsed, exit_code="1" if exc else "0",
        )
        return job_id

    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        return None

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        return {j: self._done.get(j) or JobInfo(job_id=j, state="LOST", exit_code="debug job of another process")
                for j in job_ids}

    def cancel(self, job_id: str) -> None:
        self._done.setdefault(job_id, JobInfo(job_id=job_id, state="CANCELLED"))
