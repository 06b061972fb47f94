"""The canaries before a sweep as `canary`, `report` and `status` show them (control/canary.py runs
them): per canary its shape, state, reason, attempts (kind `canary`) and their GPU-hours, job ids,
and each check of its record."""

from __future__ import annotations

from typing import Any

from ..contracts.accounting import attempt_gpu_hours
from ..contracts.states import ATTEMPT_KIND_CANARY
from ..ledger import Ledger


def canary_rows(ledger: Ledger, experiment_id: int) -> list[dict[str, Any]]:
    """One row per canary of the experiment version, oldest first."""
    rows = []
    for c in ledger.canaries(experiment_id):
        run = ledger.get_run(c.run.run_key)
        atts = [a for a in run.attempts if a.kind == ATTEMPT_KIND_CANARY]
        rec = c.record or {}
        rows.append({"key": c.key, "run_key": run.run_key, "shape": dict(c.shape), "state": c.state,
                     "reason": c.reason, "gpus": c.gpus, "attempts": len(atts),
                     "gpu_hours": sum(attempt_gpu_hours(a.gpu_hours_job, a.gpu_hours_scheduler) or 0.0 for a in atts),
                     "job_ids": [a.job_id for a in atts if a.job_id],
                     "checks": [{"name": k.get("name"), "passed": k.get("passed"),
                                 "skipped": bool(k.get("skipped_sleep_wake")), "reason": k.get("reason") or None}
                                for k in rec.get("checks") or []],
                     "device": rec.get("device")})
    return rows


def canary_line(row: dict[str, Any], name: str, version: int) -> str:
    """One line of text for a canary (status, report)."""
    s = row["shape"]
    what = f"canary {row['key']} ({s['model']}, rollout {s['rollout']}, ZeRO-{s['zero_stage']}): {row['state']}"
    if row["state"] in ("failed", "lost"):
        what += f": {row['reason']}; its runs were cancelled; `ggpo-batch canary {name}@{version} --rerun` after a fix"
    elif row["state"] != "passed":
        what += "; the runs of its shape are held until it passes"
    return what
