"""The `debug` executor: submitit's DebugExecutor, the run on this host, one rank.

For tests and for stepping through a run with a debugger. `submit` returns after the run ended;
a debug job exists only in the process that submitted it, so any other process polls it as LOST.
The payload runs inside the calling process (a debugger can step into it), except in a worker,
where it runs in a process forked for it (executor/forked.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import submitit  # here, not in the call: a worker forks each call, which would import it again

from ..contracts.allocation import STATE_OF_EXIT_CODE, record_path
from ..contracts.evaluation_spec import EvaluationSpec
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec
from ..errors import ExecutorError
from . import forked
from .base import Executor, JobInfo
from .payload import make_payload

log = logging.getLogger(__name__)
_ids = itertools.count(1)


class DebugExecutor(Executor):
    name = "debug"

    def __init__(self) -> None:
        self._done: dict[str, JobInfo] = {}

    def submit(self, spec: RunSpec | EvaluationSpec, attempt: int, folder: Path, *, lookup: bool = True,
               priority: str = DEFAULT_PRIORITY) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        job_id = f"debug-{int(time.time())}-{next(_ids)}"
        start = datetime.now(UTC)
        t0 = time.monotonic()
        payload = make_payload(spec, record_path(folder))
        if forked.in_worker():
            try:
                error, code = json.loads(forked.call_forked(lambda: json.dumps(_run(folder, payload)), own_group=False))
            except ExecutorError as exc:  # its process died (the OOM killer, a signal)
                error, code = str(exc), 1
        else:
            error, code = _run(folder, payload)
        elapsed = time.monotonic() - t0
        if error is not None:
            log.error("debug job %s failed: %s", job_id, error)
            (folder / "error.txt").write_text(f"{error}\n")
        # A job that stopped with an exit code the executors read (preempted, at its time limit) says so.
        state = "COMPLETED" if error is None else STATE_OF_EXIT_CODE.get(code, "FAILED")
        self._done[job_id] = JobInfo(
            job_id=job_id, state=state, start=start,
            end=start + timedelta(seconds=elapsed), elapsed_seconds=elapsed, exit_code=str(code),
        )
        return job_id

    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        return None

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        return {j: self._done.get(j) or JobInfo(job_id=j, state="LOST", exit_code="debug job of another process")
                for j in job_ids}

    def cancel(self, job_id: str) -> None:
        self._done.setdefault(job_id, JobInfo(job_id=job_id, state="CANCELLED"))


def _run(folder: Path, payload: Callable[[], Any]) -> tuple[str | None, int]:
    """Run `payload` as a submitit debug job in this process: (None, 0), or what it raised and its
    exit code: that of a job that stopped preempted or at its time limit, else 1."""
    # exception() runs the job without DebugJob.results()'s post-mortem debugger prompt.
    exc = submitit.DebugExecutor(folder=folder).submit(payload).exception()
    if exc is None:
        return None, 0
    code = getattr(exc, "exit_code", 1)
    return f"{type(exc).__name__}: {exc}", code if code in STATE_OF_EXIT_CODE else 1
