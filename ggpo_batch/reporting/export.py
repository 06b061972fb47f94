"""`ledger export`: runs and attempts as flat rows (CSV for a spreadsheet, JSON for a notebook).

Columns are fixed and named after the ledger and the seed-000 record (`counts.*`, `cost.*`), so a
sheet built on one export still reads the next. CSV cells that a spreadsheet would run as a formula
(text starting with = + - @) are prefixed with a quote.
"""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any, TextIO

from ..contracts.accounting import attempt_gpu_hours, disagrees
from ..contracts.run_record import AUX_COST_KEYS, COST_KEYS, COUNT_KEYS
from ..errors import LedgerError
from ..ledger import Ledger
from .report import run_gpu_hours

log = logging.getLogger(__name__)

FORMATS = ("csv", "json")
TABLES = ("runs", "attempts")

RUN_COLUMNS: tuple[str, ...] = (
    "experiment", "version", "method", "source", "queue", "run_key", "arm", "seed", "state", "attempts",
    "estimated_gpu_hours", "allocated_gpu_hours", "cause", "steps", "budget_seconds", "loop_seconds",
    "overshoot_seconds", "overshoot_fraction", "elapsed_seconds", "training_status", "budget_status",
) + tuple(f"counts.{k}" for k in COUNT_KEYS if k != "steps") + tuple(f"cost.{k}" for k in COST_KEYS + AUX_COST_KEYS) + (
    "created_at", "updated_at",
)
ATTEMPT_COLUMNS: tuple[str, ...] = (
    "experiment", "version", "run_key", "arm", "seed", "number", "kind", "executor", "job_id", "state", "scheduler_state",
    "reason", "submitted_by", "worker", "gpus", "created_at", "submitted_at", "started_at", "ended_at",
    "elapsed_seconds", "gpu_hours_job", "gpu_hours_scheduler", "gpu_hours_booked", "accounting_disagreement",
    "exit_code",
)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _iso(v: datetime | None) -> str | None:
    return v.isoformat() if v is not None else None


def _run_row(exp: Any, run: Any) -> dict[str, Any]:
    res = run.result or {}
    tr, bu, ti = res.get("training", {}), res.get("budget", {}), res.get("timing", {})
    row: dict[str, Any] = {
        "experiment": exp.name, "version": exp.version, "method": exp.method, "source": exp.source,
        "queue": exp.queue, "run_key": run.run_key, "arm": run.arm, "seed": run.seed, "state": run.state,
        "attempts": len(run.attempts), "estimated_gpu_hours": run.estimated_gpu_hours,
        "allocated_gpu_hours": run_gpu_hours(run), "cause": run.cause,
        "steps": tr.get("counts", {}).get("steps"), "budget_seconds": bu.get("budget_seconds"),
        "loop_seconds": bu.get("loop_seconds"), "overshoot_seconds": bu.get("overshoot_seconds"),
        "overshoot_fraction": bu.get("overshoot_fraction"), "elapsed_seconds": ti.get("elapsed_seconds"),
        "training_status": tr.get("status"), "budget_status": bu.get("status"),
        "created_at": _iso(run.created_at), "updated_at": _iso(run.updated_at),
    }
    for k in COUNT_KEYS:
        if k != "steps":
            row[f"counts.{k}"] = tr.get("counts", {}).get(k)
    for k in COST_KEYS + AUX_COST_KEYS:
        row[f"cost.{k}"] = tr.get("cost", {}).get(k)
    return row


def _attempt_rows(exp: Any, run: Any) -> Iterator[dict[str, Any]]:
    for a in run.attempts:
        yield {
            "experiment": exp.name, "version": exp.version, "run_key": run.run_key, "arm": run.arm,
            "seed": run.seed, "number": a.number, "kind": a.kind, "executor": a.executor, "job_id": a.job_id,
            "state": a.state, "scheduler_state": a.scheduler_state, "reason": a.reason,
            "submitted_by": a.submitted_by, "worker": a.worker, "gpus": a.gpus,
            "created_at": _iso(a.created_at), "submitted_at": _iso(a.submitted_at),
            "started_at": _iso(a.started_at), "ended_at": _iso(a.ended_at),
            "elapsed_seconds": a.elapsed_seconds, "gpu_hours_job": a.gpu_hours_job,
            "gpu_hours_scheduler": a.gpu_hours_scheduler,
            "gpu_hours_booked": attempt_gpu_hours(a.gpu_hours_job, a.gpu_hours_scheduler),
            "accounting_disagreement": disagrees(a.gpu_hours_job, a.gpu_hours_scheduler),
            "exit_code": a.exit_code,
        }


def iter_rows(ledger: Ledger, table: str, experiment: str | None = None) -> Iterator[dict[str, Any]]:
    """Rows of `table` (runs | attempts) of every experiment (or one, all its versions), in ledger
    order, read a page of runs at a time: memory stays flat however large the ledger."""
    exps = ledger.experiments(experiment)
    if experiment is not None and not exps:
        raise LedgerError(f"no experiment {experiment!r} in the ledger")
    for exp in exps:
        for run in ledger.status_runs(exp.id):
            if table == "runs":
                yield _run_row(exp, run)
            else:
                yield from _attempt_rows(exp, run)


def export_rows(ledger: Ledger, experiment: str | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(runs, attempts) rows as lists (for a notebook; the CLI streams `iter_rows` instead)."""
    return list(iter_rows(ledger, "runs", experiment)), list(iter_rows(ledger, "attempts", experiment))


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, str) and v.startswith(_FORMULA_START):
        return "'" + v
    if isinstance(v, float):
        return repr(v)  # shortest exact round trip, no locale or rounding
    return v


def write_csv(rows: Iterable[dict[str, Any]], columns: Sequence[str], out: TextIO) -> int:
    w = csv.DictWriter(out, fieldnames=list(columns), extrasaction="raise", lineterminator="\n")
    w.writeheader()
    n = 0
    for r in rows:
        w.writerow({c: _cell(r.get(c)) for c in columns})
        n += 1
    return n


def export_ledger(ledger: Ledger, out: TextIO, *, fmt: str, table: str | None = None,
                  experiment: str | None = None) -> int:
    """Write the export to `out`; returns the number of rows written.

    CSV holds one table (`table`, default runs); JSON holds both unless `table` names one:
    {"schema": 1, "runs": [...], "attempts": [...]}, ready for `pandas.DataFrame(data["runs"])`.
    """
    if fmt not in FORMATS:
        raise LedgerError(f"export format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if table is not None and table not in TABLES:
        raise LedgerError(f"export table {table!r}: must be one of {', '.join(TABLES)}")
    if experiment is not None and not ledger.experiments(experiment):
        raise LedgerError(f"no experiment {experiment!r} in the ledger")  # before a byte is written
    if fmt == "csv":
        name = table or "runs"
        return write_csv(iter_rows(ledger, name, experiment), RUN_COLUMNS if name == "runs" else ATTEMPT_COLUMNS,
                         out)
    # JSON, written as it is read; its schema number first (ggpo_batch/common/schemas.py).
    from ..common.schemas import stream_head

    n = 0
    names = [name for name in ("attempts", "runs") if table in (None, name)]
    out.write(stream_head("ledger_export"))
    for name in names:
        out.write(f', "{name}": [')
        for i, row in enumerate(iter_rows(ledger, name, experiment)):
            out.write(("," if i else "") + "\n " + json.dumps(row, sort_keys=True, allow_nan=False))
            n += 1
        out.write("\n]")
    out.write("}\n")
    return n
