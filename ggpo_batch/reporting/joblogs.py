"""An attempt's job output: where each executor's job writes its stdout and stderr, read whole, as a
tail, or followed while the attempt runs (`ggpo-batch logs`, the dashboard's log tail).

The slurm and local executors run the job through submitit with the attempt folder as submitit's
folder, so each rank (submitit task) writes `<job id>_<rank>_log.out` and `.err` there (submitit's
`JobPaths`); a requeued Slurm job keeps writing into the folder of the attempt that submitted it.
The debug executor runs the job inside the worker's own process: its output is in the worker's log,
and only a failure's `error.txt` is in the attempt folder.

The files are the job's, not ours (ggpo_batch/common/untrusted_files.py): read only when they are regular
files inside the attempt folder (a link leading out of it, a FIFO or a device is refused: `LogRefused`,
an unreadable one `LogNotPermitted`), streamed in blocks whatever their size, a tail found by reading
backwards from the end, and cut at line ends (`LineCuts`) so that no word, and so no secret the output
masks, is split between two writes.
"""

from __future__ import annotations

import codecs
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..common.untrusted_files import (
    FileRefused,
    blocks,
    check_regular,
    line_start,
    open_checked,
    open_regular,
    real_roots,
)
from ..contracts.states import ATTEMPT_FINAL
from ..errors import EXIT_NOTHING_YET, GgpoError, NotPermitted
from ..ledger.schema import Attempt, Run

STREAMS = ("stdout", "stderr")
DEBUG_ERROR_NAME = "error.txt"  # what the debug executor leaves in the attempt folder when its job failed


ATTEMPT_FOLDER = "the attempt folder"
# submitit's task (rank) in a file name: ASCII digits only ("٣" and "²" are digits to str.isdigit).
_RANK = re.compile(r"^(0|[1-9][0-9]{0,5})$")
# A line end is looked for at most this far (characters) before text is written anyway, cut at a space.
HOLD_MAX_CHARS = 64 << 10


class LogRefused(GgpoError):
    """A log file that is not read: a link leading out of the attempt folder, a FIFO, a device (exit 2)."""


class LogNotPermitted(NotPermitted):
    """A log file the system does not let this user read (exit 6)."""


def refusal(path: Path, exc: FileRefused) -> GgpoError:
    """The one-line error of a refused log file."""
    if exc.permission:
        return LogNotPermitted(f"reading {path}", exc.problem)
    return LogRefused(f"{path}: {exc.problem}")


class NoLog(GgpoError):
    """The attempt has no log to show (yet): not an error of the command, nothing to read. Exit 5, so
    a script can tell "try again later" from a bad run key (2)."""

    exit_code = EXIT_NOTHING_YET


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

    @property
    def roots(self) -> tuple[Path, ...]:
        return real_roots([self.folder])

    def to_dict(self) -> dict[str, object]:
        files = []
        for f in self.files:
            size, problem = file_state(f.path, self.roots)
            files.append({"rank": f.rank, "stream": f.stream, "path": str(f.path), "bytes": size, "problem": problem})
        return {"run_key": self.run_key, "attempt": self.attempt, "executor": self.executor, "job_id": self.job_id,
                "folder": str(self.folder), "ranks": list(self.ranks), "files": files}


def file_state(path: Path, roots: Sequence[Path]) -> tuple[int | None, str | None]:
    """(bytes, None) of a log file that can be shown; (None, None) when there is none (yet); (None,
    why not) when it is refused."""
    try:
        return check_regular(path, roots, ATTEMPT_FOLDER)[1].st_size, None
    except FileRefused as exc:
        return None, None if exc.absent else exc.problem


def job_folder(jobs_dir: Path, run: Run, att: Attempt) -> Path:
    """The folder an attempt's job writes into: that of the first attempt booked on the same job id
    (a requeued job keeps its folder), else the attempt's own."""
    from ..contracts.allocation import attempt_folder

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
            if _RANK.match(task):
                found.add(int(task))
    return tuple(sorted(found))


class LineCuts:
    """Text fed in pieces, given back cut at line ends ("\n" or "\r"): a piece that `feed` returns
    ends a line, so a word (a password the output masks) is never split between two writes. A line
    longer than HOLD_MAX_CHARS is given back cut at its last whitespace, so what is held stays bounded."""

    def __init__(self) -> None:
        self.held = ""

    def feed(self, text: str) -> str:
        text = self.held + text
        cut = max(text.rfind("\n"), text.rfind("\r")) + 1
        if not cut and len(text) > HOLD_MAX_CHARS:
            cut = max(text.rfind(" "), text.rfind("\t")) + 1 or len(text)
        self.held = text[cut:]
        return text[:cut]

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


def read_text(path: Path, roots: Sequence[Path], lines: int | None = None, *,
              max_bytes: int | None = None) -> Iterator[str]:
    """The text of a log file (invalid UTF-8 replaced) in pieces cut at line ends, or of its last
    `lines` lines (`untrusted_files.line_start`: a "\r" ends a line), or of at most its last
    `max_bytes`. Memory stays bounded whatever the size; FileRefused for a file that is not read."""
    with open_regular(path, roots, ATTEMPT_FOLDER) as (fd, st):
        yield from _text(fd, _start(fd, st.st_size, lines, max_bytes), st.st_size)


def _start(fd: int, size: int, lines: int | None, max_bytes: int | None) -> int:
    start = 0 if lines is None else line_start(fd, size, lines, max_bytes=max_bytes)
    return start if max_bytes is None else max(start, size - max_bytes)


def _text(fd: int, start: int, end: int) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    cuts = LineCuts()
    try:
        for chunk in blocks(fd, start, end):
            if text := cuts.feed(decoder.decode(chunk)):
                yield text
    except OSError as exc:
        raise FileRefused(f"cannot be read ({exc.strerror})") from None
    if text := cuts.feed(decoder.decode(b"", final=True)) + cuts.flush():
        yield text


def tail_text(path: Path, lines: int | None = None, *, roots: Sequence[Path] | None = None,
              max_bytes: int | None = None) -> str:
    """The file's text, or its last `lines` lines, or at most its last `max_bytes` of them (said on
    a first line when that cuts them); "" if there is no such file. `roots`: the folders it may be
    reached in (default: its own folder)."""
    roots = real_roots([path.parent]) if roots is None else roots
    try:
        with open_regular(path, roots, ATTEMPT_FOLDER) as (fd, st):
            start = _start(fd, st.st_size, lines, max_bytes)
            text = "".join(_text(fd, start, st.st_size))
    except FileRefused as exc:
        if exc.absent:
            return ""
        raise
    if max_bytes is not None and start and start == st.st_size - max_bytes:
        return f"[... earlier output not shown: the last {max_bytes:,} bytes follow ...]\n{text}"
    return text


@dataclass
class _Followed:
    """A followed file: its descriptor (kept: a file deleted while followed is still read to its end),
    how far it was read, and its text decoder and line cuts."""

    file: LogFile
    fd: int
    inode: tuple[int, int]
    offset: int
    decoder: codecs.IncrementalDecoder
    cuts: LineCuts


def follow(files: Callable[[], tuple[LogFile, ...]], running: Callable[[], bool], *,
           roots: Callable[[], Sequence[Path]], poll: float = 0.5, check_every: float = 2.0,
           start_at_end: bool = False,
           refused: Callable[[LogFile, FileRefused], None] = lambda f, exc: None) -> Iterator[tuple[LogFile, str]]:
    """Yield (file, new text) as the files grow, until `running()` says the attempt ended; what it
    wrote before it ended is yielded too. `files()` is asked again while waiting, so files that
    appear later (a job still waiting for its allocation) are followed from their first byte. A
    file is read through its descriptor: deleted meanwhile, what the job still writes to it is read;
    replaced by a new file (a requeued job), the new one is read from its start. A file that is not
    read (`roots()`: the folders it may be in) is passed to `refused` once per problem."""
    followed: dict[Path, _Followed] = {}
    said: dict[Path, str] = {}
    last_check, alive, first_pass = 0.0, True, True
    try:
        while True:
            now = time.monotonic()
            if now - last_check >= check_every:
                alive, last_check = running(), now  # read before the files: nothing written before the end is lost
            listed = files()
            # a followed file no longer listed (deleted, and the job's only log) is still read
            names = {f.path for f in listed}
            gone = tuple(s.file for path, s in followed.items() if path not in names)
            for f in (*listed, *gone):
                state = followed.get(f.path)
                current = _inode(f.path)
                if state is not None and current is not None and current != state.inode:  # replaced: the new file
                    yield from _flush(f, followed.pop(f.path))
                    state = None
                if state is None:
                    try:
                        fd, st = open_checked(f.path, roots(), ATTEMPT_FOLDER)
                    except FileRefused as exc:
                        if not exc.absent and said.get(f.path) != exc.problem:
                            said[f.path] = exc.problem
                            refused(f, exc)
                        continue
                    said.pop(f.path, None)
                    # `start_at_end`: files there at the start are followed from their end (their tail was
                    # shown); a file that appears later is new output, read from its first byte
                    state = followed[f.path] = _Followed(
                        f, fd, (st.st_dev, st.st_ino), st.st_size if start_at_end and first_pass else 0,
                        codecs.getincrementaldecoder("utf-8")(errors="replace"), LineCuts())
                yield from _read_new(f, state)
            first_pass = False
            if not alive:
                for path in list(followed):
                    state = followed.pop(path)
                    yield from _flush(state.file, state)
                return
            time.sleep(poll)
    finally:
        for state in followed.values():
            os.close(state.fd)


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _read_new(f: LogFile, state: _Followed) -> Iterator[tuple[LogFile, str]]:
    try:
        size = os.fstat(state.fd).st_size
        if size < state.offset:  # truncated (a requeued job's file rewritten): from the top
            state.offset = 0
        for chunk in blocks(state.fd, state.offset, size):
            state.offset += len(chunk)
            if text := state.cuts.feed(state.decoder.decode(chunk)):
                yield f, text
    except OSError:
        return


def _flush(f: LogFile, state: _Followed) -> Iterator[tuple[LogFile, str]]:
    """The rest of a followed file (its last, unfinished line), and its descriptor closed."""
    try:
        yield from _read_new(f, state)
        if text := state.cuts.feed(state.decoder.decode(b"", final=True)) + state.cuts.flush():
            yield f, text
    finally:
        os.close(state.fd)


def attempt_running(att: Attempt, run: Run) -> bool:
    """Is any attempt of the job `att` belongs to still live (a requeue continues it under a new number)?"""
    same = [a for a in run.attempts if a.job_id == att.job_id] if att.job_id else [att]
    return any(a.state not in ATTEMPT_FINAL for a in same)
