"""What a worker starts on its own host runs in a process forked for it, not in the worker.

A worker runs its RQ jobs in its own, long-lived process (worker.py). Two executors start work
on the worker's host: the debug executor trains inside the calling process, and the local
executor spawns submitit's controller as a child of the calling process. In a worker, both go
through `call_forked`: a training run's crash, memory and leftover state end with its own
process, and a local job is left an orphan in a process group of its own, as it was under RQ's
forking worker (a Ctrl-C or a warm shutdown of the worker does not reach it, and the worker
does not collect its exit).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Callable

from ..common.parent_death import signal_at_parent_death
from ..errors import ExecutorError

_in_worker = False


def serve_a_worker() -> None:
    """Called once by a worker process: from now on the executors start their work forked."""
    global _in_worker
    _in_worker = True


def in_worker() -> bool:
    return _in_worker


def call_forked(fn: Callable[[], str], *, own_group: bool) -> str:
    """Run `fn` in a child forked for it and return the text it returned.

    The child dies with this process (the kernel's parent-death signal); `own_group` puts it in
    a process group of its own, which whatever it starts inherits. If this process is
    interrupted while it waits (its RQ job's timeout, a cold shutdown), the child is killed
    first. Raises ExecutorError if `fn` raised or the child died without answering."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # Everything inherited out of this process's garbage collections: a collection that
            # walked the worker's objects would write to their pages, copying each (copy on write).
            gc.freeze()
            os.close(read_end)
            signal_at_parent_death(signal.SIGKILL)
            if os.getppid() != parent:  # the worker died before the request took effect
                raise SystemExit(1)
            if own_group:
                os.setpgrp()
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C asks the worker, not this, to stop
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                reply = "ok:" + fn()
            except BaseException as exc:  # noqa: BLE001 (reported to the parent, which raises it)
                reply = f"error:{type(exc).__name__}: {exc}"
            with os.fdopen(write_end, "wb") as pipe:
                pipe.write(reply.encode(errors="replace"))
            code = 0
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001, S110 (nothing may keep this process from leaving)
                    pass
            # Never back into the worker's loop; nor its exit handlers, nor its connections' goodbyes.
            os._exit(code)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as pipe:
            said = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):  # already reaped
            pass
        raise
    if said.startswith("ok:"):
        return said[3:]
    if said.startswith("error:"):
        raise ExecutorError(said[6:])
    code = os.waitstatus_to_exitcode(status)
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    raise ExecutorError(f"the process forked for it {how} without answering")
