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

from .errors import RecordError
from .ledger import Ledger, NewRun
from .ledger.schema import utcnow
from .run_record import check_results_file
from .spec import run_key

MAX_RESULTS_BYTES = 64 << 20


@dataclass(frozen=True)
class ImportReport:
    experiment: str
    version: int
    runs: int
    created: bool
    total_gpu_hours: float


def _load(path: Path) -> tuple[Any, bytes]:
    if not path.exists():
        raise RecordError(f"{path}: no such file")
    if path.is_dir():
        raise RecordError(f"{path}: is a directory, not a results file")
    size = path.stat().st_size
    if size > MAX_RESULTS_BYTES:
        raise RecordError(f"{path}: {size} bytes; a results file is at most {MAX_RESULTS_BYTES}")
    raw = path.read_bytes()
    if not raw.strip():
        raise RecordError(f"{path}: is empty")
    try:
        return json.loads(raw), raw
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None


def default_name(path: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem).strip("_-") or "imported"
    return stem[:64]


def _outcome(rec: dict[str, Any]) -> str:
    """A valid record is a run whose allocation finished: `succeeded`, as settlement books a run that
    wrote one. Its stamps stay in the stored result, where `status` and `report` show a failed rollout
    audit or a budget/exposure short of target apart from clean runs (README, the ggpo section)."""
    return "succeeded"


def import_results(ledger: Ledger, path: str | Path, *, actor: str, name: str | None = None,
                   method: str = "ggpo") -> ImportReport:
    """Import `path`; return what happened. Raises RecordError listing every broken record."""
    path = Path(path)
    data, raw = _load(path)
    problems = check_results_file(data)
    if problems:
        shown = "; ".join(problems[:10]) + (f"; ... {len(problems) - 10} more" if len(problems) > 10 else "")
        raise RecordError(f"{path}: {len(problems)} problem(s), nothing imported: {shown}")
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
    spec = {"imported_from": path.name, "arms": arms, "seeds": seeds, "sha256": hashlib.sha256(raw).hexdigest(),
            "loop_budget_seconds": sorted({r["budget"]["budget_seconds"] for r in records})}
    ledger.import_finished(name=name, version=version, method=method, spec_hash=spec_hash, spec=spec,
                           gpus=max(r["timing"]["gpus"] for r in records), actor=actor, source_path=str(path),
                           runs=runs, outcomes=outcomes)
    return ImportReport(name, version, len(data), True, total)
