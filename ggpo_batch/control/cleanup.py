"""Keeping a run's files in bounds: its checkpoint once its record is booked, and (`ggpo-batch gc`)
the checkpoints and attempt folders of finished runs.

What is never removed: a result record, its details, an exported policy, an evaluation record
(wherever they are), the folder holding the last attempt's logs (for a job Slurm requeued, the
folder of the attempt that submitted it: `joblogs.job_folder`), and anything of a run that is not finished or has an attempt
that may still hold an allocation. Each run's files are removed with the run locked in the ledger
(`Ledger.clean_run`), which books what went as an event in the same transaction.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ..contracts.allocation import (
    CHECKPOINT_NAME,
    DETAILS_NAME,
    EVALUATION_RECORD_NAME,
    POLICY_SUFFIX,
    RECORD_NAME,
    checkpoint_folder,
)
from ..contracts.states import IN_FLIGHT_ATTEMPT_STATES, UNFINISHED_RUN_STATES
from ..ledger import Ledger
from ..ledger.schema import Run, utcnow
from ..reporting.joblogs import job_folder

log = logging.getLogger(__name__)

# Files of an attempt folder that gc never removes: what the run produced.
PROTECTED_NAMES = frozenset({RECORD_NAME, DETAILS_NAME, RECORD_NAME + POLICY_SUFFIX, EVALUATION_RECORD_NAME})
# A checkpoint folder of a job run outside the queue's layout (`train -o X` writes X.ckpt).
LEGACY_CHECKPOINT_SUFFIX = ".ckpt"


def size_of(path: Path) -> int:
    """Bytes of a file or of everything under a folder (links not followed)."""
    try:
        if path.is_symlink() or path.is_file():
            return path.lstat().st_size
    except OSError:
        return 0
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass(frozen=True)
class Removal:
    """One path removed (or, on a dry run, that would be), with what it is and its size."""

    path: Path
    what: str  # checkpoint | attempt folder | attempt files
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "what": self.what, "bytes": self.bytes}


def _describe(removals: Iterable[Removal]) -> str:
    items = list(removals)
    parts = [f"{r.what} {r.path.name} ({_mb(r.bytes)})" for r in items]
    return f"removed {', '.join(parts)}: {_mb(sum(r.bytes for r in items))} freed"


def drop_checkpoint(ledger: Ledger, run_key: str, folder: Path, *, actor: str) -> str | None:
    """After a run's record is booked: remove its checkpoint (beside the attempt folder `folder`)
    unless its spec keeps it (`keep_checkpoints`); the removal is booked as an event."""
    ckpt = checkpoint_folder(folder)
    if not ckpt.exists():
        return None

    def remove(run: Run) -> str | None:
        if (run.run_spec or {}).get("keep_checkpoints"):
            return None
        gone = Removal(ckpt, "checkpoint", size_of(ckpt))
        _remove(ckpt)
        return f"record booked: {_describe([gone])}"

    return ledger.clean_run(run_key, actor=actor, remove=remove)


def run_removals(jobs_dir: Path, run: Run) -> list[Removal]:
    """What gc would remove of a finished `run`: its checkpoint (and checkpoints in its attempt
    folders), and its attempt folders but the one holding the last attempt's logs; in a folder that
    holds a record, details or a policy, everything but those."""
    run_dir = Path(jobs_dir) / run.run_key
    root = Path(jobs_dir).resolve()
    if not run_dir.is_dir() or not run_dir.resolve().is_relative_to(root) or run_dir.resolve() == root:
        return []
    kept = job_folder(jobs_dir, run, run.attempts[-1]).name if run.attempts else None
    out: list[Removal] = []
    for entry in sorted(run_dir.iterdir()):
        if entry.is_symlink():
            continue
        if entry.name == CHECKPOINT_NAME and entry.is_dir():
            out.append(Removal(entry, "checkpoint", size_of(entry)))
            continue
        if not entry.is_dir() or not entry.name.startswith("attempt-"):
            continue
        legacy = [c for c in entry.iterdir() if c.name.endswith(LEGACY_CHECKPOINT_SUFFIX) and c.is_dir()]
        out += [Removal(c, "checkpoint", size_of(c)) for c in legacy]
        if entry.name == kept:
            continue
        rest = [c for c in entry.iterdir() if c not in legacy]
        if any(c.name in PROTECTED_NAMES for c in rest):
            out += [Removal(c, "attempt files", size_of(c)) for c in rest if c.name not in PROTECTED_NAMES]
        else:
            out.append(Removal(entry, "attempt folder", size_of(entry)))
    return out


@dataclass
class GcReport:
    dry_run: bool
    runs: list[dict[str, Any]] = field(default_factory=list)
    freed_bytes: int = 0
    skipped_live: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "runs": self.runs, "freed_bytes": self.freed_bytes,
                "skipped_live": self.skipped_live}


def _live(run: Run) -> bool:
    return run.state in UNFINISHED_RUN_STATES or any(a.state in IN_FLIGHT_ATTEMPT_STATES for a in run.attempts)


def _clean(ledger: Ledger, run: Run, planned: list[Removal], *, actor: str) -> list[Removal] | None:
    """Remove what was `planned` for `run` (read unlocked) with the run locked, if it is still
    finished and has the same attempts; what was removed, or None when it was left alone."""
    seen = [a.number for a in run.attempts]
    done: list[Removal] = []

    def remove(locked: Run) -> str | None:
        done.clear()  # the ledger may run this transaction again
        if [a.number for a in locked.attempts] != seen:
            return None
        for r in planned:
            _remove(r.path)
            done.append(r)
        return f"gc: {_describe(done)}" if done else None

    return done if ledger.clean_run(run.run_key, actor=actor, remove=remove) is not None else None


def _cutoff(older_than: timedelta) -> datetime:
    """Now less `older_than`; an age reaching past year 1 is the earliest time (nothing is that old)."""
    try:
        return utcnow() - older_than
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def collect(ledger: Ledger, jobs_dir: Path, *, actor: str, older_than: timedelta | None = None,
            experiment: str | None = None, dry_run: bool = False) -> GcReport:
    """Remove the checkpoints and attempt folders of finished runs (of `experiment`, or all) whose
    last move is older than `older_than`; with `dry_run`, only say what would go."""
    rep = GcReport(dry_run=dry_run)
    cutoff = _cutoff(older_than) if older_than is not None else None
    exps = ledger.experiments(experiment)
    for exp in exps:
        for run in ledger.runs(experiment_id=exp.id):
            if _live(run):
                rep.skipped_live += 1
                continue
            if cutoff is not None and run.updated_at > cutoff:
                continue
            planned = run_removals(jobs_dir, run)
            if not planned:
                continue
            done = planned if dry_run else _clean(ledger, run, planned, actor=actor)
            if done is None:
                continue
            freed = sum(r.bytes for r in done)
            rep.freed_bytes += freed
            rep.runs.append({"run_key": run.run_key, "state": run.state, "bytes": freed,
                             "removed": [r.to_dict() for r in done]})
            log.info("gc %s: %s", run.run_key, _describe(done))
    return rep
