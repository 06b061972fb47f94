"""The log tails of a run's attempts, for the run page: which files (`joblogs`, the one home of the
job-folder and file-name rules, shared with `ggpo-batch logs`), their last lines, secrets redacted,
or the reason there is no log yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import redact
from ..errors import GgpoError
from ..joblogs import attempt_logs, tail_text
from ..ledger.schema import Attempt, Run

TAIL_LINES = 200


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def attempt_tails(jobs_dir: Path, run: Run, att: Attempt, lines: int = TAIL_LINES) -> dict[str, Any]:
    """{"logs": [{name, rank, stream, size, tail}], "no_log": None} of an attempt, stdout before stderr
    rank by rank; or no logs and "no_log": why there is none (yet), as `ggpo-batch logs` says it."""
    try:
        found = attempt_logs(jobs_dir, run, att)
    except GgpoError as exc:  # NoLog (not yet, or a debug job's output in its worker's log), an imported attempt
        return {"logs": [], "no_log": redact(exc.message)}
    logs = [{"name": f.path.name, "rank": f.rank, "stream": f.stream, "size": _size(f.path),
             "tail": redact(tail_text(f.path, lines))} for f in found.files]
    return {"logs": [entry for entry in logs if entry["size"] is not None], "no_log": None}
