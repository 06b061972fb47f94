"""The RQ scheduler process of a worker, which ends when its worker's does (control/worker.py starts it)."""

from __future__ import annotations

import os
import signal
from typing import Any

from rq.scheduler import RQScheduler

from ..common.parent_death import signal_at_parent_death


class SchedulerDyingWithWorker(RQScheduler):
    """RQ's scheduler, whose process ends when its worker's does.

    RQ forks the scheduler from the worker (a `worker --burst` too, at its first maintenance
    cycle). A worker killed with SIGKILL (the OOM killer, a node's cleanup) left it running for
    ever, holding its queues' scheduler lock. This one asks the kernel for SIGTERM, its own graceful
    stop (locks released), when the worker dies (Linux's PR_SET_PDEATHSIG)."""

    def start(self) -> Any:
        self._worker_pid = os.getpid()
        return super().start()

    def work(self) -> None:
        watched = signal_at_parent_death(signal.SIGTERM)
        if os.getppid() != self._worker_pid:  # the worker died before the request took effect
            self.log.warning("scheduler: its worker is gone; not starting")
            return
        if not watched:  # not Linux: RQ's own behaviour
            self.log.warning("scheduler: this system cannot end it with its worker")
        super().work()
