"""Collecting the exit of a fork server's children, one home for the two servers that fork ranks
(train/run/rankfork.py, executor/rank_server.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator


def reaped() -> Iterator[tuple[int, int]]:
    """Each child of this process that has ended, reaped as it is yielded: (pid, exit code; negative:
    the signal that killed it). Never waits for a child still running."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:  # no child left
            return
        if pid == 0:  # none has ended
            return
        yield pid, os.waitstatus_to_exitcode(status)
