"""Status: per-experiment tables of runs with attempts, steps, elapsed and GPU-hours, and totals.

Pure data (dicts) so the CLI can print a table or JSON of the same content.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Sequence

from ..accounting import attempt_gpu_hours, disagrees
from ..ledger import Ledger
from ..ledger.schema import Attempt, Run
from ..run_record import audit_failed, budget_reconciled


def _attempt_cost(a: Attempt) -> float | None:
    return attempt_gpu_hours(a.gpu_hours_job, a.gpu_hours_scheduler)


def run_row(run: Run, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One status row. GPU-hours sum every attempt, so the cost of a retry stays visible."""
    atts = list(run.attempts)
    costs = [_attempt_cost(a) for a in atts]
    spent = [c for c in costs if c is not None]
    last = atts[-1] if atts else None
    result = run.result or {}
    steps = result.get("training", {}).get("counts", {}).get("steps")
    elapsed = sum(a.elapsed_seconds for a in atts if a.elapsed_seconds is not None) if atts else None
    row = {
        "run_key": run.run_key,
        "arm": run.arm,
        "seed": run.seed,
        "state": run.state,
        "attempts": len(atts),
        "steps": steps,
        "elapsed_seconds": elapsed,
        "allocated_gpu_hours": sum(spent) if spent else None,
        "estimated_gpu_hours": run.estimated_gpu_hours,
        "job_id": last.job_id if last else None,
        "worker": run.worker,
        "cause": run.cause,
        "accounting_disagreement": any(disagrees(a.gpu_hours_job, a.gpu_hours_scheduler) for a in atts),
        # The record's stamps: a run may end `succeeded` (its allocation completed and wrote a valid
        # record) while its rollout audit failed or its budget/exposure was short; shown, never hidden.
        "training_status": result.get("training", {}).get("status"),
        "budget_status": result.get("budget", {}).get("status"),
        "audit_failed": audit_failed(run.result),
        "budget_reconciled": budget_reconciled(run.result) if run.result else None,
    }
    if extra:
        row.update(extra)
    return row


def _totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    gh = [r["allocated_gpu_hours"] for r in rows if r["allocated_gpu_hours"] is not None]
    states: dict[str, int] = defaultdict(int)
    for r in rows:
        states[r["state"]] += 1
    return {"runs": len(rows), "states": dict(sorted(states.items())),
            "audit_failed": sum(1 for r in rows if r["audit_failed"]),
            "budget_not_reconciled": sum(1 for r in rows if r["budget_reconciled"] is False),
            "attempts": sum(r["attempts"] for r in rows),
            "steps": sum(r["steps"] for r in rows if r["steps"] is not None),
            "allocated_gpu_hours": sum(gh)}


def experiment_status(ledger: Ledger, *, experiment: str | None = None, states: Iterable[str] | None = None,
                      queue_info: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per experiment version: rows, per-arm totals and experiment totals (filtered by name/state)."""
    wanted = set(states) if states else None
    out = []
    for exp in ledger.experiments(experiment):
        runs = ledger.runs(experiment_id=exp.id)
        rows = [run_row(r, (queue_info or {}).get(r.run_key)) for r in runs if wanted is None or r.state in wanted]
        if wanted is not None and not rows:
            continue
        by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_arm[r["arm"]].append(r)
        out.append({
            "experiment": exp.name,
            "version": exp.version,
            "method": exp.method,
            "source": exp.source,
            "queue": exp.queue,
            "gpus": exp.gpus,
            "max_gpu_hours": exp.max_gpu_hours,
            "runs": rows,
            "arms": {arm: _totals(rs) for arm, rs in sorted(by_arm.items())},
            "totals": _totals(rows),
            "estimated_gpu_hours": _sum_known(r.estimated_gpu_hours for r in runs),
            "decided_runs": sum(1 for r in rows if r["state"] == "not_reproduced"),
            "decisions": [decision_row(d) for d in ledger.decisions(exp.name)],
        })
    return out


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def decided_experiments(ledger: Ledger, *, experiment: str | None = None) -> list[dict[str, Any]]:
    """Decisions about experiments that have no runs in the ledger (decided before anything was queued)."""
    known = {e.name for e in ledger.experiments(experiment)}
    return [decision_row(d) for d in ledger.decisions(experiment) if d.experiment_name not in known]


def decision_row(d: Any) -> dict[str, Any]:
    return {"kind": d.kind, "experiment": d.experiment_name, "estimated_gpu_hours": d.estimated_gpu_hours,
            "cap_gpu_hours": d.cap_gpu_hours, "cost_basis": d.cost_basis, "cost_type": d.cost_type,
            "available_budget": d.available_budget, "resolution": d.resolution, "review_done": d.review_done,
            "automatic_retry": d.automatic_retry, "decided_by": d.decided_by,
            "decided_at": d.decided_at.isoformat() if d.decided_at else None, "reason": d.reason}
