"""Polling until something holds, with a timeout that fails the test saying what it waited for."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from ggpo_batch.control.reconcile import reconcile


def wait_until(cond: Callable[[], object], timeout_s: float, what: str, interval: float = 0.2) -> object:
    """Call `cond` every `interval` s until it returns something true, and return that."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def reconcile_until_ended(ledger, settings, queue, executors, timeout_s: float = 90):  # type: ignore[no-untyped-def]
    """Run reconcile cycles (1 s apart) until no attempt is active; return every cycle's report."""
    end = time.monotonic() + timeout_s
    reports = []
    while time.monotonic() < end:
        reports.append(reconcile(ledger, settings, [queue], actor="test", executors=executors,
                                 stale_after=timedelta(0)))
        if reports[-1].active == 0:
            return reports
        time.sleep(1)
    raise AssertionError(f"attempts still active after {timeout_s} s: {reports[-1]}")


def preempt_after_step(log: Path, step: int, within_s: float) -> None:
    """In a thread: once rank 0's `log` says `step <step> `, send this process SIGUSR1, as a
    scheduler's preemption (`train_local` forwards it to its ranks); nothing after `within_s`."""

    def watch() -> None:
        deadline = time.time() + within_s
        while time.time() < deadline:
            if log.exists() and f"step {step} " in log.read_text(errors="replace"):
                os.kill(os.getpid(), signal.SIGUSR1)
                return
            time.sleep(0.05)  # a tiny model's steps take a fraction of a second: signal the step that was asked

    threading.Thread(target=watch, daemon=True).start()
