"""The contract between a worker and the allocation it starts: where an attempt's files live,
what the job writes there, how the job learns when its allocation began, and how it says it was
preempted. Executors, the training job, settlement and the CLI import these; none restates them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# The attempt's result record (one entry of seeds/000), written by the job, read by settlement.
RECORD_NAME = "record.json"
# The job's details beside its record: history, audit and the evaluation (per item), which
# settlement reads into the run's outcome (ggpo_batch/outcome.py).
DETAILS_SUFFIX = ".details.json"
DETAILS_NAME = RECORD_NAME + DETAILS_SUFFIX
# Exported by the first line of the batch script: the allocation's start (epoch seconds), so the
# job's own GPU-hours include interpreter and torch start-up, as the scheduler's do.
ALLOC_START_ENV = "GGPO_ALLOC_START"
# Exit status of a job that stopped on a preemption signal with no requeue left (EX_TEMPFAIL):
# the Slurm executor reports such a job PREEMPTED, not FAILED, so the ledger books the cause.
PREEMPTED_EXIT_CODE = 75


def attempt_folder(jobs_dir: Path, run_key: str, number: int) -> Path:
    """`<jobs_dir>/<run_key>/attempt-<number>/`: the attempt's job files, logs and record."""
    return Path(jobs_dir) / run_key / f"attempt-{number}"


def record_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` writes its result record."""
    return Path(folder) / RECORD_NAME


def details_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` writes its details (evaluation included)."""
    return Path(folder) / DETAILS_NAME


def details_of(record: Path) -> Path:
    """The details file a job writes beside the result record `record` (any path: `train -o`)."""
    return Path(str(record) + DETAILS_SUFFIX)


def alloc_start_export(shell_now: str) -> str:
    """The batch-script line that exports the allocation's start; `shell_now` is the shell
    expression for "now" in epoch seconds (bash 5: `$EPOCHREALTIME`)."""
    return f"export {ALLOC_START_ENV}={shell_now}"


def allocation_start() -> float:
    """When this allocation began (epoch s), from the executor's export; now if absent or absurd."""
    raw = os.environ.get(ALLOC_START_ENV, "")
    try:
        start = float(raw)
    except ValueError:
        return time.time()
    now = time.time()
    return start if 0 <= now - start < 7 * 24 * 3600 else now
