"""`ledger import`: load a results file of the seed-000 schema (keyed "<seed>/<arm>") into the ledger.

The whole file is checked first (schema and accounting invariants); a file with any broken
record is refused and nothing is written. Importing the same file twice changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError

from ..common import limits
from ..contracts.run_record import check_results_file
from ..contracts.runspec import run_key
from ..errors import RecordError
from ..ledger import Ledger, NewRun
from ..ledger.schema import utcnow
from . import progress

MAX_RESULTS_BYTES = limits.RESULTS_MAX_BYTES


@dataclass(frozen=True)
class ImportReport:
    experiment: str
    version: int
    runs: int
    created: bool
    total_gpu_hours: float


def _load(path: Path) -> tuple[Any, bytes]:
    """The parsed file and its bytes: a regular file within the size limit, JSON within the limits
    (no NaN or Infinity, integers of at most 64 bits, bounded nesting), checked before anything is read
    into the ledger."""
    try:
        raw = limits.read_input_file(path, max_bytes=MAX_RESULTS_BYTES, what="results file")
        if not raw.strip():
            raise limits.InputRefused("is empty")
        return limits.load_json(raw), raw
    except limits.InputRefused as exc:
        raise RecordError(f"{path}: {exc.problem}") from None


def _identity_problems(data: Any) -> list[str]:
    """What the ledger and the queue need of each record beyond the seed-000 schema: an arm name a
    run key (an RQ job id) can hold and a seed that fits the ledger, on SQLite and PostgreSQL alike."""
    if not isinstance(data, dict):
        return []
    problems = []
    for key, rec in data.items():
        if not isinstance(rec, dict):
            continue
        problem = limits.arm_name_problem(rec.get("arm")) if isinstance(rec.get("arm"), str) else None
        if problem:
            problems.append(f"{key}.arm {problem}")
        seed = rec.get("seed")
        problem = limits.seed_problem(seed) if isinstance(seed, int) and not isinstance(seed, bool) else None
        if problem:
            problems.append(f"{key}.seed {problem}")
        timing = rec.get("timing")
        if isinstance(timing, dict):
            gpus, elapsed = timing.get("gpus"), timing.get("elapsed_seconds")
            if isinstance(gpus, int) and not isinstance(gpus, bool) and limits.int_problem(gpus, 0, limits.INT32_MAX):
                problems.append(f"{key}.timing.gpus {limits.int_problem(gpus, 0, limits.INT32_MAX)}")
            if isinstance(elapsed, (int, float)) and not isinstance(elapsed, bool) and \
                    elapsed > limits.DURATION_MAX_SECONDS:
                problems.append(f"{key}.timing.elapsed_seconds is {elapsed:g}; at most {limits.DURATION_MAX_SECONDS}")
    return problems


def default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem).strip("_-") or "imported"
    return stem[:64]


def _outcome(rec: dict[str, Any]) -> str:
    """A valid record is a run whose allocation finished: `succeeded`, as settlement books a run that
    wrote one. Its stamps stay in the stored result, where `status` and `report` show a failed rollout
    audit or a budget/exposure short of target apart from clean runs (docs/how-it-works.md, the stamps)."""
    return "succeeded"


def import_results(ledger: Ledger, path: str | Path, *, actor: str, name: str | None = None,
                   method: str = "ggpo") -> ImportReport:
    """Import `path`; return what happened. Raises RecordError listing every broken record."""
    path = Path(path)
    with progress.task(f"import {path.name}", total=3, after=2.0) as shown:  # read, check, write
        shown.note("reading")
        data, raw = _load(path)
        shown.advance(note=f"checking {len(data) if isinstance(data, dict) else 0} record(s)")
        problems = check_results_file(data) + _identity_problems(data)
        shown.advance(note="writing" if not problems else f"{len(problems)} problem(s)")
        report = _import_checked(ledger, path, data, raw, problems, actor=actor, name=name, method=method)
        shown.advance(note=f"{report.runs} run(s) as {report.experiment} v{report.version}"
                      + ("" if report.created else " (already imported: nothing changed)"))
        return report


def _import_checked(ledger: Ledger, path: Path, data: Any, raw: bytes, problems: list[str], *, actor: str,
                    name: str | None, method: str) -> ImportReport:
    if problems:
        shown = "; ".join(problems[:10]) + (f"; ... {len(problems) - 10} more" if len(problems) > 10 else "")
        raise RecordError(f"{path}: {len(problems)} problem(s), nothing imported: {shown}")
    if name is not None and limits.name_problem(name):
        raise RecordError(f"--name {limits.name_problem(name)}")
    if limits.name_problem(method):
        raise RecordError(f"--method {limits.name_problem(method)}")
    name = name or default_name(path)
    spec_hash = hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    total = sum(r["timing"]["allocated_gpu_hours_through_evaluation"] for r in data.values())
    existing = ledger.latest_experiment(name)
    if existing is not None:
        if existing.spec_hash == spec_hash:
            return ImportReport(name, existing.version, len(data), False, total)
        raise RecordError(
            f"{path}: experiment {name!r} already exists with different content; import it under another --name"
        )
    version = 1
    records = sorted(data.values(), key=lambda r: (r["seed"], r["arm"]))
    runs, outcomes = [], []
    now = utcnow()
    for rec in records:
        timing = rec["timing"]
        key = run_key(name, version, rec["seed"], rec["arm"])
        config = {"arm": rec["arm"], "seed": rec["seed"], "budget_seconds": rec["budget"]["budget_seconds"],
                  "gpus": timing["gpus"]}
        chash = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
        runs.append(NewRun(run_key=key, arm=rec["arm"], seed=rec["seed"], config_hash=chash, run_spec=config))
        state = _outcome(rec)
        # The file carries durations, not clock times: the import time stands in for the end.
        outcomes.append((state, rec, {
            "gpus": timing["gpus"], "elapsed_seconds": timing["elapsed_seconds"],
            "gpu_hours_job": timing["allocated_gpu_hours_through_evaluation"],
            "ended_at": now, "started_at": now - timedelta(seconds=timing["elapsed_seconds"]),
            "reason": None if state == "succeeded" else f"training.status={rec['training']['status']}",
        }))
    arms = sorted({r["arm"] for r in records})
    seeds = sorted({r["seed"] for r in records})
    spec = {"imported_from": limits.path_text(path.name), "arms": arms, "seeds": seeds, "sha256": hashlib.sha256(raw).hexdigest(),
            "loop_budget_seconds": sorted({r["budget"]["budget_seconds"] for r in records})}
    try:
        ledger.import_finished(name=name, version=version, method=method, spec_hash=spec_hash, spec=spec,
                               gpus=max(r["timing"]["gpus"] for r in records), actor=actor,
                               source_path=limits.path_text(path), runs=runs, outcomes=outcomes)
    except IntegrityError:
        # Another import of this name committed between our check and our write (the transaction
        # rolled back whole): the same file is already imported; a different one is refused.
        existing = ledger.latest_experiment(name)
        if existing is not None and existing.spec_hash == spec_hash:
            return ImportReport(name, existing.version, len(data), False, total)
        raise RecordError(f"{path}: experiment {name!r} was created meanwhile with different content; "
                          f"import it under another --name") from None
    return ImportReport(name, version, len(data), True, total)
