"""A process's own metrics (prometheus_client): the one home of their names, and how a worker
carries what its forked processes count.

Counters and histograms of what this process did (a reconcile cycle's seconds, sacct calls and
errors, the sbatch pacing wait, ledger retries), made on first use so that a command that never
counts imports nothing. The ledger's own figures (runs per state, the outbox) are not here: the
dashboard reads them from the ledger at scrape time (reporting/ledger_metrics.py).

A worker serves its metrics on `worker --metrics-port` (control/metrics_port.py) in
prometheus_client's multiprocess mode: `use_directory(DIR)`, called once before anything counts,
keeps every value in a memory-mapped file of DIR per process id, so what a process forked from the
worker counts (a debug payload, RQ's scheduler, a local job's launcher: executor/forked.py) lands in
a file of its own there and the worker's `/metrics` sums them all. The directory is the worker's
own (a fresh temporary one, removed when it stops); a counter that cannot be written (the folder
gone under a process that outlived its worker) is dropped, never raised: a metric never fails the
work it counts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

# prometheus_client's multiprocess mode reads its folder from this variable (processes forked or
# started from the worker inherit it).
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# A job's environment never points at its worker's folder: the job's own libraries (vLLM's metrics,
# among them) would count into it, and on another host the folder does not exist. The executors'
# job scripts start with this line (executor/slurm.py, executor/local.py).
UNSET_FOR_JOBS = f"unset {MULTIPROC_DIR_ENV}"

# name -> (kind, help, histogram buckets or None). Counters' names end in _total (the exposition adds it
# for prometheus_client's Counter, so the name given to it is without).
RECONCILE_SECONDS = "ggpo_reconcile_seconds"
RECONCILE_FAILURES = "ggpo_reconcile_failures_total"
SACCT_CALLS = "ggpo_sacct_calls_total"
SACCT_ERRORS = "ggpo_sacct_errors_total"
SACCT_SECONDS = "ggpo_sacct_seconds"
SBATCH_PACING_WAIT = "ggpo_sbatch_pacing_wait_seconds"
LEDGER_RETRIES = "ggpo_ledger_retries_total"

_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_WAIT_BUCKETS = (0.0, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PROCESS_METRICS: dict[str, tuple[str, str, tuple[float, ...] | None]] = {
    RECONCILE_SECONDS: ("histogram", "Seconds one reconcile cycle took.", _SECONDS_BUCKETS),
    RECONCILE_FAILURES: ("counter", "Reconcile cycles that raised (the next cycle retries).", None),
    SACCT_CALLS: ("counter", "sacct calls made (one per reconcile cycle and executor, batched).", None),
    SACCT_ERRORS: ("counter", "sacct calls that failed (not found, timed out, non-zero exit).", None),
    SACCT_SECONDS: ("histogram", "Seconds one sacct call took.", _SECONDS_BUCKETS),
    SBATCH_PACING_WAIT: ("histogram", "Seconds an sbatch waited for a token of the pacing bucket.", _WAIT_BUCKETS),
    LEDGER_RETRIES: ("counter", "Ledger calls retried because the database was unreachable or locked.", None),
}


class _Metrics:
    """The metric objects of this process, made on first use, in a registry of their own."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made: dict[str, Any] = {}
        self.registry: Any = None
        self.directory: str | None = None


_state = _Metrics()  # process-wide by nature: a metric counts what this process did, wherever it is called


def _metric(name: str) -> Any:
    with _state.lock:
        found = _state.made.get(name)
        if found is not None:
            return found
        from prometheus_client import CollectorRegistry, Counter, Histogram

        if _state.registry is None:
            _state.registry = CollectorRegistry(auto_describe=True)
        kind, help_text, buckets = PROCESS_METRICS[name]
        if kind == "counter":
            made = Counter(name.removesuffix("_total"), help_text, registry=_state.registry)
        else:
            made = Histogram(name, help_text, buckets=buckets, registry=_state.registry)
        _state.made[name] = made
        return made


def count(name: str, amount: float = 1.0) -> None:
    """Add `amount` to the counter `name` (one of PROCESS_METRICS)."""
    try:
        _metric(name).inc(amount)
    except OSError as exc:  # the multiprocess folder is gone (its worker stopped): never fail the work
        log.debug("metric %s not counted: %s", name, exc)


def observe(name: str, value: float) -> None:
    """Record `value` in the histogram `name` (one of PROCESS_METRICS)."""
    try:
        _metric(name).observe(value)
    except OSError as exc:
        log.debug("metric %s not observed: %s", name, exc)


@contextmanager
def timed(name: str, *, errors: str | None = None) -> Iterator[None]:
    """Observe the block's seconds in the histogram `name`; if it raises, count `errors` too."""
    t0 = time.perf_counter()
    try:
        yield
    except BaseException:
        if errors is not None:
            count(errors)
        raise
    finally:
        observe(name, time.perf_counter() - t0)


def declare_all() -> None:
    """Make every metric now, so a scrape shows each at 0 before it first counts (rate() needs one)."""
    for name in PROCESS_METRICS:
        try:
            _metric(name)
        except OSError as exc:
            log.debug("metric %s not made: %s", name, exc)


def use_directory(directory: str | None) -> None:
    """Count in prometheus_client's multiprocess mode in `directory` from now on, in this process and
    every process forked or started from it (None: back to this process's memory alone). Metrics
    made before are dropped (a fresh registry)."""
    from prometheus_client import values

    if directory is None:
        os.environ.pop(MULTIPROC_DIR_ENV, None)
    else:
        os.environ[MULTIPROC_DIR_ENV] = directory
    with _state.lock:
        close = getattr(values, "close_all_multiprocess_files", None)  # the files of the folder before
        if close is not None and _state.directory is not None:
            close()
        values.ValueClass = values.MultiProcessValue() if directory is not None else values.MutexValue
        _state.made.clear()
        _state.registry = None
        _state.directory = directory


def exposition() -> tuple[bytes, str]:
    """(body, content type) of this process's metrics in Prometheus' text format; in multiprocess
    mode, the sum over every process that counted in the folder."""
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        generate_latest,
    )

    if _state.directory is not None:
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=_state.directory)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    with _state.lock:
        registry = _state.registry
    return (generate_latest(registry) if registry is not None else b""), CONTENT_TYPE_LATEST
