"""The contract between a worker and the allocation it starts: where an attempt's files live,
what the job writes there, how the job learns when its allocation began, and how it says it was
preempted. Executors, the training job, settlement and the CLI import these; none restates them.
"""

from __future__ import annotations

import math
import os
import shlex
import time
from pathlib import Path
from typing import Any

# The attempt's result record (one entry of seeds/000), written by the job, read by settlement.
RECORD_NAME = "record.json"
# The job's details beside its record: history, audit and the evaluation (per item), which
# settlement reads into the run's outcome (ggpo_batch/contracts/outcome.py).
DETAILS_SUFFIX = ".details.json"
DETAILS_NAME = RECORD_NAME + DETAILS_SUFFIX
# Exported by the first line of the batch script: the allocation's start (epoch seconds), so the
# job's own GPU-hours include interpreter and torch start-up, as the scheduler's do.
ALLOC_START_ENV = "GGPO_ALLOC_START"
# Exit status of a job that stopped on a preemption signal with no requeue left (EX_TEMPFAIL):
# the Slurm executor reports such a job PREEMPTED, not FAILED, so the ledger books the cause.
PREEMPTED_EXIT_CODE = 75
# Exit status of a job that checkpointed because its time limit was near, and stopped: reported
# TIMEOUT, with TIME_LIMIT_NAME in the attempt folder saying where it stopped.
TIME_LIMIT_EXIT_CODE = 76
# What the executors report for a job that exited with one of the codes above.
STATE_OF_EXIT_CODE = {PREEMPTED_EXIT_CODE: "PREEMPTED", TIME_LIMIT_EXIT_CODE: "TIMEOUT"}
# Written by a job that stopped at its time limit with a checkpoint (rank 0, after the save):
# step, loop and budget seconds, this allocation's elapsed seconds. Settlement reads it to decide
# between "continue in a new allocation" (the spec's continue_on_timeout) and the run's timeout.
TIME_LIMIT_NAME = "time_limit.json"
# Written by a training job that stopped itself because its run cannot be trusted (rank 0: the
# weight-sync probe failed, train/run/weight_sync.py): the reason, the step, the history so far.
# Settlement puts the reason into the ledger's cause of the failed run.
STOPPED_NAME = "stopped.json"
# A run's resumable checkpoint: one folder per run beside its attempt folders, so an attempt that
# continues the run (a new allocation after a time limit, a retry) finds the one before it wrote.
CHECKPOINT_NAME = "checkpoint"
# A run's trained policy, exported beside its record as a Hugging Face directory.
POLICY_SUFFIX = ".policy"
# What an evaluation after training writes in its attempt folder (train/eval_job.py), read by
# settlement (evaluation_jobs.py): its own small record, not a seeds/000 entry.
EVALUATION_RECORD_NAME = "evaluation.json"
# Exported by the batch script with the allocation's time limit and the profile's signal delay
# (seconds): the job's save deadline is start + limit - delay (`save_deadline`), counted from
# the allocation's start, not from the end of the job's own setup.
TIME_LIMIT_ENV = "GGPO_TIME_LIMIT_S"
SIGNAL_DELAY_ENV = "GGPO_SIGNAL_DELAY_S"


def attempt_folder(jobs_dir: Path, run_key: str, number: int) -> Path:
    """`<jobs_dir>/<run_key>/attempt-<number>/`: the attempt's job files, logs and record."""
    return Path(jobs_dir) / run_key / f"attempt-{number}"


def record_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` writes its result record."""
    return Path(folder) / RECORD_NAME


def details_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` writes its details (evaluation included)."""
    return Path(folder) / DETAILS_NAME


def evaluation_record_path(folder: Path) -> Path:
    """Where the evaluation job of the attempt in `folder` writes its evaluation record."""
    return Path(folder) / EVALUATION_RECORD_NAME


def details_of(record: Path) -> Path:
    """The details file a job writes beside the result record `record` (any path: `train -o`)."""
    return Path(str(record) + DETAILS_SUFFIX)


def policy_of(record: Path) -> Path:
    """Where a job exports its trained policy: a Hugging Face directory beside its record."""
    return Path(str(record) + POLICY_SUFFIX)


def checkpoint_folder(folder: Path) -> Path:
    """The run's checkpoint folder, for the attempt in `folder` (`<jobs_dir>/<run_key>/checkpoint/`)."""
    return Path(folder).parent / CHECKPOINT_NAME


def time_limit_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` says it stopped at its time limit."""
    return Path(folder) / TIME_LIMIT_NAME


def stopped_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` says why it stopped itself (a training failure)."""
    return Path(folder) / STOPPED_NAME


def write_stopped(folder: Path, reason: str, **more: Any) -> None:
    """Say why the job of the attempt in `folder` stopped itself (STOPPED_NAME: `reason` and `more`)."""
    import json

    Path(folder).mkdir(parents=True, exist_ok=True)
    path = stopped_path(folder)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps({"reason": reason, **more}, indent=2) + "\n")
    os.replace(tmp, path)


# vLLM's own cache (compiled graphs, torch.compile artefacts): under the jobs folder, shared by the
# runs of this ledger, not the user's home (~/.cache/vllm, often a small or network file system on a
# cluster); a worker's or a profile's own VLLM_CACHE_ROOT wins.
VLLM_CACHE_ENV = "VLLM_CACHE_ROOT"
VLLM_CACHE_NAME = "vllm-cache"


def vllm_cache_export(jobs_dir: Path) -> str:
    """The batch-script line that sets VLLM_CACHE_ROOT to `<jobs_dir>/vllm-cache` unless it is set."""
    return f"export {VLLM_CACHE_ENV}=${{{VLLM_CACHE_ENV}:-{shlex.quote(str(Path(jobs_dir) / VLLM_CACHE_NAME))}}}"


def alloc_start_export(shell_now: str) -> str:
    """The batch-script line that exports the allocation's start; `shell_now` is the shell
    expression for "now" in epoch seconds (bash 5: `$EPOCHREALTIME`)."""
    return f"export {ALLOC_START_ENV}={shell_now}"


def time_limit_export(time_limit_s: float, signal_delay_s: float) -> str:
    """The batch-script line that tells the job its time limit and the profile's signal delay."""
    return f"export {TIME_LIMIT_ENV}={int(time_limit_s)} {SIGNAL_DELAY_ENV}={int(signal_delay_s)}"


def save_deadline(start: float) -> float | None:
    """When the job must have stopped to checkpoint (epoch s): the allocation's `start` + its time
    limit - the signal delay (the window kept for the save and the exit); None without a time limit."""
    try:
        limit = float(os.environ[TIME_LIMIT_ENV])
        delay = float(os.environ.get(SIGNAL_DELAY_ENV, "0"))
    except (KeyError, ValueError):
        return None
    if not (math.isfinite(limit) and limit > 0 and math.isfinite(delay) and delay >= 0):
        return None
    return start + limit - min(delay, limit)


def allocation_start() -> float:
    """When this allocation began (epoch s), from the executor's export; now if absent or absurd."""
    raw = os.environ.get(ALLOC_START_ENV, "")
    try:
        start = float(raw)
    except ValueError:
        return time.time()
    now = time.time()
    return start if 0 <= now - start < 7 * 24 * 3600 else now


# The digest of the container image the allocation runs in (e.g. sha256:...), set by whoever starts
# it (the Dockerfile's header says how), not a setting of ggpo-batch's: read by the job at its start
# and recorded in each attempt's provenance (run_provenance.py).
IMAGE_DIGEST_ENV = "GGPO_IMAGE_DIGEST"


def image_digest() -> str | None:
    """The container image digest of this allocation, or None outside an image."""
    digest = os.environ.get(IMAGE_DIGEST_ENV, "").strip()
    return digest[:200] or None


# The scheduler's id of the job a process runs in: Slurm's, else submitit's local executor's.
JOB_ID_ENVS = ("SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID")


def job_log_context(run_key: str, output: str | Path, rank: int) -> dict[str, object]:
    """What every log line of an attempt's job carries (config/logs.py): its run key, its attempt
    number (from the attempt folder `output` lies in, `attempt-<number>`), its job id, its rank."""
    folder = Path(output).parent.name
    number = folder.removeprefix("attempt-")
    job_id = next((os.environ[n] for n in JOB_ID_ENVS if os.environ.get(n)), None)
    return {"run_key": run_key, "attempt": int(number) if number.isdigit() else None, "job_id": job_id,
            "rank": rank}
