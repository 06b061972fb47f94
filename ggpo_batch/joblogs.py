"""An attempt's job output: where each executor's job writes its stdout and stderr, read whole, as a
tail, or followed while the attempt runs (`ggpo-batch logs`, the dashboard's log tail).

The slurm and local executors run the job through submitit with the attempt folder as submitit's
folder, so each rank (submitit task) writes `<job id>_<rank>_log.out` and `.err` there (submitit's
`JobPaths`); a requeued Slurm job keeps writing into the folder of the attempt that submitted it.
The debug executor runs the job inside the worker's own process: its output is in the worker's log,
and only a failure's `error.txt` is in the attempt folder.
"""

from __future__ import annotations

import codecs
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import GgpoError
from .ledger.schema import Attempt, Run
from .states import ATTEMPT_FINAL

STREAMS = ("stdout", "stderr")
DEBUG_ERROR_NAME = "error.txt"  # what the debug executor leaves in the attempt folder when its job failed


class NoLog(GgpoError):
    """The attempt has no log to show (yet): not an error of the command, nothing to read. Exit 5, so
    a script can tell "try again later" from a bad run key (2)."""

    exit_code = 5


@dataclass(frozen=True)
class LogFile:
    rank: int
    stream: str  # stdout | stderr
    path: Path


@dataclass(frozen=True)
class AttemptLogs:
    """The log files of one attempt's job (those of one rank, or all), and where they live."""

    run_key: str
    attempt: int
    executor: str
    job_id: str | None
    folder: Path
    files: tuple[LogFile, ...]
    ranks: tuple[int, ...]  # ranks that have a log so far

    def to_dict(self) -> dict[str, object]:
        return {"run_key": self.run_key, "attempt": self.attempt, "executor": self.executor, "job_id": self.job_id,
                "folder": str(self.folder), "ranks": list(self.ranks),
                "files": [{"rank": f.rank, "stream": f.stream, "path": str(f.path), "bytes": _size(f.path)}
                          for f in self.files]}


def job_folder(jobs_dir: Path, run: Run, att: Attempt) -> Path:
    """The folder an attempt's job writes into: that of the first attempt booked on the same job id
    (a requeued job keeps its folder), else the attempt's own."""
    from .allocation import attempt_folder

    same = [a.number for a in run.attempts if att.job_id and a.job_id == att.job_id]
    return attempt_folder(jobs_dir, run.run_key, min(same) if same else att.number)


def pick_attempt(run: Run, number: int | None) -> Attempt:
    """Attempt `number` of `run` (default: the last); NoLog for a run with none, GgpoError (exit 2) for
    a number it does not have."""
    atts = list(run.attempts)
    if not atts:
        raise NoLog(f"{run.run_key} is {run.state} and has no attempt yet: no job, so no log")
    if number is None:
        return atts[-1]
    for a in atts:
        if a.number == number:
            return a
    raise GgpoError(f"{run.run_key} has attempt(s) {', '.join(str(a.number) for a in atts)}; no attempt {number}")


def attempt_logs(jobs_dir: Path, run: Run, att: Attempt, rank: int | None = None) -> AttemptLogs:
    """The log files of `att` (rank `rank`, or every rank with a log); NoLog when there are none yet."""
    folder = job_folder(jobs_dir, run, att)
    where = f"{run.run_key} attempt {att.number}"
    if att.executor == "import":
        raise GgpoError(f"{where} was imported from a results file: it has no job and no log")
    if att.executor == "debug":
        err = folder / DEBUG_ERROR_NAME
        if err.is_file():
            return AttemptLogs(run.run_key, att.number, att.executor, att.job_id, folder,
                               (LogFile(0, "stderr", err),), (0,))
        raise NoLog(f"{where} ran with the debug executor, inside its worker's process: its output is in that "
                    f"worker's log ({att.worker or 'worker unknown'}), not in {folder}")
    if not att.job_id:
        raise NoLog(f"{where} is {att.state}: no job yet, so no log")
    ranks = _ranks(folder, att.job_id)
    if not ranks:
        state = ("waiting for its allocation" if att.state == "submitted" else att.state)
        raise NoLog(f"{where} (job {att.job_id}) has no log yet in {folder}: it is {state}")
    if rank is not None and rank not in ranks:
        raise GgpoError(f"{where}: rank {rank} has no log; ranks with a log: {', '.join(map(str, ranks))}")
    chosen = ranks if rank is None else (rank,)
    return AttemptLogs(run.run_key, att.number, att.executor, att.job_id, folder,
                       tuple(LogFile(r, s, log_path(folder, att.job_id, r, s)) for r in chosen for s in STREAMS), ranks)


def log_path(folder: Path, job_id: str, rank: int, stream: str) -> Path:
    """submitit's file for one rank's stdout or stderr."""
    from submitit.core.utils import JobPaths

    paths = JobPaths(folder, job_id=job_id, task_id=rank)
    return paths.stdout if stream == "stdout" else paths.stderr


def _ranks(folder: Path, job_id: str) -> tuple[int, ...]:
    prefix = f"{job_id}_"
    found = set()
    try:
        names = os.listdir(folder)
    except OSError:
        return ()
    for name in names:
        if name.startswith(prefix) and name.endswith(("_log.out", "_log.err")):
            task = name[len(prefix):-len("_log.out")]
            if task.isdigit():
                found.add(int(task))
    return tuple(sorted(found))


def _size(p: Path) -> int | None:
    try:
        return p.stat().st_size
    except OSError:
        return None


def tail_text(path: Path, lines: int | None = None, *, block: int = 64 * 1024) -> str:
    """The file's text (invalid UTF-8 replaced), or its last `lines` lines, read from the end."""
    try:
        with open(path, "rb") as fh:
            if lines is None:
                return fh.read().decode("utf-8", errors="replace")
            fh.seek(0, os.SEEK_END)
            end = pos = fh.tell()
            data = b""
            while pos > 0 and data.count(b"\n") <= lines:
                pos = max(0, pos - block)
                fh.seek(pos)
                data = fh.read(end - pos)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    kept = text.splitlines(keepends=True)[-lines:] if lines else []
    return "".join(kept)


def follow(files: Callable[[], tuple[LogFile, ...]], running: Callable[[], bool], *, poll: float = 0.5,
           check_every: float = 2.0, start_at_end: bool = False) -> Iterator[tuple[LogFile, str]]:
    """Yield (file, new text) as the files grow, until `running()` says the attempt ended; what it
    wrote before it ended is yielded too. `files()` is asked again while waiting, so files that
    appear later (a job still waiting for its allocation) are followed from their first byte."""
    offsets: dict[Path, int] = {}
    decoders: dict[Path, codecs.IncrementalDecoder] = {}
    last_check, alive, first_pass = 0.0, True, True
    while True:
        now = time.monotonic()
        if now - last_check >= check_every:
            alive, last_check = running(), now  # read before the files: nothing written before the end is lost
        for f in files():
            if f.path not in offsets:
                # `start_at_end`: files there at the start are followed from their end (their tail was
                # shown); a file that appears later is new output, read from its first byte
                offsets[f.path] = (_size(f.path) or 0) if start_at_end and first_pass else 0
                decoders[f.path] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            size = _size(f.path)
            if size is None:
                continue
            if size < offsets[f.path]:  # truncated (a requeued job's file rewritten): from the top
                offsets[f.path] = 0
            if size > offsets[f.path]:
                with open(f.path, "rb") as fh:
                    fh.seek(offsets[f.path])
                    chunk = fh.read(size - offsets[f.path])
                offsets[f.path] += len(chunk)
                text = decoders[f.path].decode(chunk)
                if text:
                    yield f, text
        first_pass = False
        if not alive:
            return
        time.sleep(poll)


def attempt_running(att: Attempt, run: Run) -> bool:
    """Is any attempt of the job `att` belongs to still live (a requeue continues it under a new number)?"""
    same = [a for a in run.attempts if a.job_id == att.job_id] if att.job_id else [att]
    return any(a.state not in ATTEMPT_FINAL for a in same)
