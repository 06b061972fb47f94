"""Slurm accounting: the state, times and allocated GPUs of many jobs from ONE `sacct` call.

Slurm 22.05's sacct has no `Restarts` field; a requeued job shows one record per run of it with
`--duplicates` (the earlier ones in state REQUEUED or PREEMPTED), so restarts are counted from
those records and each one is kept as a segment the ledger can book as its own attempt.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from ..common import metrics
from ..errors import ExecutorError
from .base import JobAccount, JobInfo

log = logging.getLogger(__name__)

FIELDS = ("JobID", "JobName", "State", "Start", "End", "ElapsedRaw", "AllocTRES", "ExitCode", "Comment")

# States sacct/squeue report that are neither PENDING, RUNNING nor final, mapped onto those.
_STATE_ALIASES = {
    "REQUEUED": "PENDING",
    "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING",
    "CONFIGURING": "PENDING",
    "SUSPENDED": "RUNNING",
    "STOPPED": "RUNNING",
    "COMPLETING": "RUNNING",
    "SIGNALING": "RUNNING",
    "STAGE_OUT": "RUNNING",
    "RESIZING": "RUNNING",
    "CANCELED": "CANCELLED",
    "REVOKED": "CANCELLED",
    "SPECIAL_EXIT": "FAILED",
}


def normalize_state(raw: str) -> str:
    """`CANCELLED by 0` -> CANCELLED; `REQUEUED` -> PENDING; unknown words pass through upper-cased."""
    word = raw.strip().split(" ", 1)[0].rstrip("+").upper()
    return _STATE_ALIASES.get(word, word) if word else "UNKNOWN"


def parse_gpus(alloc_tres: str) -> int | None:
    """The GPU count in an AllocTRES string (`billing=1,cpu=1,gres/gpu=4,node=1` -> 4); None if unallocated."""
    if not alloc_tres.strip():
        return None
    total = None
    typed = 0
    for item in alloc_tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            total = int(value)
        elif key.startswith("gres/gpu:"):  # typed count (gres/gpu:a100=4), listed beside the total
            typed += int(value)
    return total if total is not None else typed


def _parse_time(value: str) -> datetime | None:
    if value in ("", "Unknown", "None", "N/A"):
        return None
    return datetime.fromisoformat(value).astimezone()  # sacct prints the cluster's local time


@dataclass(frozen=True)
class SacctRecord:
    """One sacct line: one run of a job (a requeued job has several)."""

    job_id: str
    name: str
    raw_state: str
    info: JobInfo
    comment: str


def parse_line(line: str) -> SacctRecord:
    """Parse one `sacct -P` line of FIELDS."""
    parts = line.split("|")
    if len(parts) < len(FIELDS):
        raise ExecutorError(f"sacct printed a line with {len(parts)} fields, expected {len(FIELDS)}: {line!r}")
    # Comment is last and may itself contain '|': join the rest back.
    job_id, name, state, start, end, elapsed, tres, exit_code = parts[:8]
    comment = "|".join(parts[8:])
    info = JobInfo(
        job_id=job_id,
        state=normalize_state(state),
        start=_parse_time(start),
        end=_parse_time(end),
        elapsed_seconds=float(elapsed) if elapsed.strip() else None,
        alloc_gpus=parse_gpus(tres),
        exit_code=exit_code or None,
    )
    return SacctRecord(job_id=job_id, name=name, raw_state=state, info=info, comment=comment)


def parse_output(text: str) -> dict[str, list[SacctRecord]]:
    """Group sacct lines by job id, in the order sacct printed them (oldest run first)."""
    out: dict[str, list[SacctRecord]] = {}
    for line in text.splitlines():
        if line.strip():
            rec = parse_line(line)
            out.setdefault(rec.job_id, []).append(rec)
    return out


def accounts_from_records(grouped: dict[str, list[SacctRecord]]) -> dict[str, JobAccount]:
    """Each earlier record of a job id is a run that was requeued (preempted or `scontrol requeue`)."""
    out = {}
    for job_id, recs in grouped.items():
        latest = replace(recs[-1].info, restarts=len(recs) - 1)
        out[job_id] = JobAccount(
            latest=latest, segments=tuple(r.info for r in recs), name=recs[-1].name, comments=tuple(r.comment for r in recs)
        )
    return out


Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str], timeout_s: float = 60.0) -> str:
    """Run a Slurm client command without a shell; a failure becomes an ExecutorError."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        raise ExecutorError(f"{argv[0]} not found: is this a Slurm submit host?") from None
    except subprocess.TimeoutExpired:
        raise ExecutorError(f"{argv[0]} did not answer in {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise ExecutorError(f"{argv[0]} failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}")
    return proc.stdout


@dataclass
class Sacct:
    """Batched sacct queries with a call counter and a minimum interval between calls.

    Slurm sites rate-limit RPCs per user; submitit users hit those limits with one call per job.
    Here every query is one call for all ids, and calls closer than `min_interval_s` wait.
    """

    command: str = "sacct"
    min_interval_s: float = 0.0
    runner: Runner = run_command
    calls: int = 0
    _last_call: float = field(default=0.0, repr=False)

    def _throttle(self) -> None:
        wait = self._last_call + self.min_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last_call = time.monotonic()

    def _run(self, extra: Sequence[str]) -> dict[str, list[SacctRecord]]:
        self._throttle()
        self.calls += 1
        metrics.count(metrics.SACCT_CALLS)
        argv = [self.command, "-X", "-D", "-P", "--noheader", *extra, "-o", ",".join(FIELDS)]
        with metrics.timed(metrics.SACCT_SECONDS, errors=metrics.SACCT_ERRORS):
            return parse_output(self.runner(argv))

    def accounts(self, job_ids: Iterable[str]) -> dict[str, JobAccount]:
        """One sacct call for all `job_ids`; ids sacct does not know (yet) are absent."""
        ids = sorted({str(j) for j in job_ids})
        if not ids:
            return {}
        for j in ids:
            if not j.replace("_", "").replace("+", "").isdigit():
                raise ExecutorError(f"{j!r} is not a Slurm job id")
        return accounts_from_records(self._run(["-j", ",".join(ids)]))

    def by_name(self, name: str, since: str = "now-30days") -> dict[str, JobAccount]:
        """Jobs named exactly `name` started or submitted since `since` (one call)."""
        return accounts_from_records(self._run(["--name", name, "-S", since]))
