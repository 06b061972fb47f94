"""The log tails of a run's attempts, for the run page: which files (`joblogs`, the one home of the
job-folder and file-name rules, shared with `ggpo-batch logs`), their last lines, or the reason there
is no log yet. The same rules as `logs` (untrusted files: a link leading out of the attempt folder, a
FIFO, a device or an unreadable file is named with why, not read), and at most TAIL_MAX_BYTES of each
file read, so a page answers within its time whatever the job wrote. Secrets are masked where every
page is (`access.scrub`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..common.untrusted_files import FileRefused
from ..errors import GgpoError
from ..ledger.schema import Attempt, Run
from ..reporting.joblogs import attempt_logs, file_state, tail_text

TAIL_LINES = 200
TAIL_MAX_BYTES = 256 << 10  # of one file's tail: a 200-line tail of a log with no line end is not 200 MiB


def attempt_tails(jobs_dir: Path, run: Run, att: Attempt, lines: int = TAIL_LINES) -> dict[str, Any]:
    """{"logs": [{name, rank, stream, size, tail, problem}], "no_log": None} of an attempt, stdout before
    stderr rank by rank; or no logs and "no_log": why there is none (yet), as `ggpo-batch logs` says it.
    A refused file has no tail and its `problem` says why."""
    try:
        found = attempt_logs(jobs_dir, run, att)
    except GgpoError as exc:  # NoLog (not yet, or a debug job's output in its worker's log), an imported attempt
        return {"logs": [], "no_log": exc.message}
    logs = []
    for f in found.files:
        size, problem = file_state(f.path, found.roots)
        tail = ""
        if problem is None and size is not None:
            try:
                tail = tail_text(f.path, lines, roots=found.roots, max_bytes=TAIL_MAX_BYTES)
            except FileRefused as exc:  # changed since it was looked at
                problem = exc.problem
        if size is not None or problem is not None:
            logs.append({"name": f.path.name, "rank": f.rank, "stream": f.stream, "size": size, "tail": tail,
                         "problem": problem})
    return {"logs": logs, "no_log": None}
