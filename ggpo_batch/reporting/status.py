"""Status: per-experiment and per-arm totals (computed in SQL), and rows for the runs worth
showing (attempts, steps, elapsed, GPU-hours, where Redis has them).

Pure data (dicts) so the CLI can print a table or JSON of the same content. By default the CLI
shows the runs that need a look (unfinished, failed, lost, flagged), a page at most: its cost
does not grow with the ledger.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..contracts.accounting import attempt_gpu_hours, disagrees
from ..contracts.arm_train import arm_changes
from ..contracts.heartbeat import HUNG_AFTER_SECONDS, is_hung, progress_text
from ..contracts.run_record import audit_failed, budget_reconciled
from ..contracts.runspec import run_lifecycle, spec_baseline
from ..contracts.states import ATTENTION_RUN_STATES, HELD
from ..ledger import Ledger
from ..ledger.heartbeats import attempt_heartbeat
from ..ledger.schema import Attempt, Run
from ..ledger.summaries import ArmTotals


def _attempt_cost(a: Attempt) -> float | None:
    return attempt_gpu_hours(a.gpu_hours_job, a.gpu_hours_scheduler)


def run_row(run: Run, extra: dict[str, Any] | None = None, *, hung_after: float = HUNG_AFTER_SECONDS,
            now: float | None = None, evaluations: Mapping[int, Sequence[tuple[str, str]]] | None = None,
            ) -> dict[str, Any]:
    """One status row. GPU-hours sum every attempt, so the cost of a retry stays visible (and that of
    an evaluation after training, whose attempts count too). The last attempt's heartbeat (None
    before its first) and, for a running run, how long it has been silent and whether that makes it
    hung (`heartbeat.is_hung`, `hung_after` seconds). `evaluations`: run id -> its evaluations after
    training (name, state), listed beside the run (`Ledger.evaluation_states`). Its provenance
    (run_provenance.py, that of its latest attempt that has one) comes in `extra`."""
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
        # "continued after time limit (2 of 3)": the run went on past its time limit in new allocations
        "continuation": continuation_label(run),
        "accounting_disagreement": any(disagrees(a.gpu_hours_job, a.gpu_hours_scheduler) for a in atts),
        # The record's stamps: a run may end `succeeded` (its allocation completed and wrote a valid
        # record) while its rollout audit failed or its budget/exposure was short; shown, never hidden.
        "training_status": result.get("training", {}).get("status"),
        "budget_status": result.get("budget", {}).get("status"),
        "audit_failed": audit_failed(run.result),
        "budget_reconciled": budget_reconciled(run.result) if run.result else None,
        "evaluations": [{"name": n, "state": st} for n, st in (evaluations or {}).get(run.id, ())],
        "provenance": None,
    }
    row.update(_liveness(run, last, hung_after, time.time() if now is None else now))
    if extra:
        row.update(extra)
    return row


def _liveness(run: Run, last: Attempt | None, hung_after: float, now: float) -> dict[str, Any]:
    hb = attempt_heartbeat(last) if last is not None else None
    heartbeat = {**hb.to_dict(), "age_seconds": max(0.0, now - hb.updated_at)} if hb else None
    silent = hung = None
    if run.state == "running" and last is not None and last.state == "running":
        since = hb.updated_at if hb else (last.started_at.timestamp() if last.started_at else None)
        silent = max(0.0, now - since) if since is not None else None
        hung = is_hung(since, now, hung_after)
    return {"heartbeat": heartbeat, "silent_seconds": silent, "hung": bool(hung)}


def state_label(row: dict[str, Any]) -> str:
    """A run's state as `status` and the dashboard print it: a running run with its progress
    (`running  step 41  1830/2700 s`), or flagged when its heartbeat stopped; and, for a run that
    went on past its time limit, `continued after time limit (2 of 3)`."""
    label = _state_label(row)
    label = f"{label}, {row['continuation']}" if row.get("continuation") else label
    if row.get("evaluations"):
        label += ", evaluation " + ", ".join(f"{e['name']} {e['state']}" for e in row["evaluations"])
    return label


def _state_label(row: dict[str, Any]) -> str:
    state, hb = row["state"], row.get("heartbeat")
    if state == HELD:
        return "held, not queued until released"
    if state != "running":
        return f"{state}, audit failed" if row.get("audit_failed") else state
    if row.get("hung"):
        ago = _duration(row.get("silent_seconds") or 0.0)
        return f"running, heartbeat stopped {ago} ago" if hb else f"running, no heartbeat {ago} after start"
    if not hb:
        return "running"
    return f"running  {progress_text(hb)}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _totals(cells: Sequence[ArmTotals]) -> dict[str, Any]:
    states: dict[str, int] = defaultdict(int)
    for c in cells:
        states[c.state] += c.runs
    return {"runs": sum(c.runs for c in cells), "states": dict(sorted(states.items())),
            "audit_failed": sum(c.audit_failed for c in cells),
            "budget_not_reconciled": sum(c.budget_not_reconciled for c in cells),
            "attempts": sum(c.attempts for c in cells),
            "steps": sum(c.steps for c in cells),
            "allocated_gpu_hours": sum(c.allocated_gpu_hours for c in cells)}


Positions = Callable[[str, "list[str] | None"], dict[str, dict[str, Any]]]


def _nodes(ledger: Ledger, ids: list[int]) -> dict[int, int]:
    """Nodes per run of each experiment, from its spec (which omits `nodes` at 1): for `nodes x GPUs`."""
    from sqlalchemy import select

    from ..ledger.schema import Experiment

    if not ids:
        return {}
    with ledger.session() as s:
        rows = s.execute(select(Experiment.id, Experiment.spec).where(Experiment.id.in_(ids))).all()
    return {i: int((spec or {}).get("nodes", 1)) if isinstance(spec, dict) else 1 for i, spec in rows}


ATTENTION_PAGE = 20  # runs that need a look listed per experiment by default


@dataclass(frozen=True)
class StatusQuery:
    """What `status` lists, from its options: one rule for the CLI and the dashboard's API."""

    states: list[str] | None  # only runs in these states (None: all)
    attention: bool  # only the runs that need a look
    limit: int | None  # most runs listed per experiment (None: all)
    with_decided: bool  # list the experiments decided before anything was queued

    @classmethod
    def of(cls, states: Iterable[str] = (), *, all_runs: bool = False, limit: int | None = None) -> StatusQuery:
        """Default: the runs that need a look, ATTENTION_PAGE at most; `--runs` or `--state`: every
        such run; `limit` 0 means no limit."""
        wanted = list(states) or None
        attention = not all_runs and wanted is None
        if limit is None:
            limit = ATTENTION_PAGE if attention else None
        return cls(wanted, attention, limit or None, wanted is None or "not_reproduced" in wanted)


def iter_experiment_status(ledger: Ledger, *, experiment: str | None = None, states: Iterable[str] | None = None,
                           attention: bool = False, limit: int | None = None, positions: Positions | None = None,
                           hung_after: float = HUNG_AFTER_SECONDS) -> Iterator[tuple[dict[str, Any], Iterator[dict[str, Any]]]]:
    """Per experiment version: its summary (per-arm and experiment totals computed in SQL over the
    runs in `states`) and an iterator of its run rows: every run, or with `attention` those that
    need a look, `limit` at most. Totals (and the estimate) cover the runs in `states`. Rows are read a page at a time, so a listing of every run
    streams. `positions(queue, run_keys or None for all)` says where Redis has queued runs; it is
    called only when a shown run is queued. A running run silent for more than `hung_after` seconds
    is flagged hung (row "hung"; summary "hung_runs") and listed first among the running."""
    wanted = list(states) if states else None
    now = time.time()
    exps = ledger.experiments(experiment)
    cells_of: dict[int, list[ArmTotals]] = defaultdict(list)
    for c in ledger.arm_totals([e.id for e in exps], states=wanted):
        cells_of[c.experiment_id].append(c)
    nodes_of = _nodes(ledger, [e.id for e in exps])
    evaluations = ledger.evaluation_states([e.id for e in exps])  # one query for every experiment shown
    for exp in exps:
        cells = cells_of[exp.id]
        if wanted is not None and not cells:
            continue
        listed = (sum(c.runs for c in cells if c.state in ATTENTION_RUN_STATES)
                  + ledger.flagged_count(exp.id, states=wanted)) if attention else sum(c.runs for c in cells)
        by_arm: dict[str, list[ArmTotals]] = defaultdict(list)
        for c in cells:
            by_arm[c.arm].append(c)
        summary = {
            "experiment": exp.name,
            "version": exp.version,
            "method": exp.method,
            "source": exp.source,
            "queue": exp.queue,
            "gpus": exp.gpus,  # per node
            "nodes": nodes_of.get(exp.id, 1),
            "max_gpu_hours": exp.max_gpu_hours,
            "view": "attention" if attention else "runs",
            "runs_not_shown": max(0, listed - limit) if limit is not None else 0,
            "arms": {arm: _totals(cs) for arm, cs in sorted(by_arm.items())},
            # what each arm changes against the baseline (contracts/arm_train.py): field -> [baseline's, arm's]
            **_changes(ledger, exp, sorted(by_arm)),
            "totals": _totals(cells),
            "estimated_gpu_hours": _sum_known(c.estimated_gpu_hours for c in cells),  # of the runs in view
            "decided_runs": sum(c.runs for c in cells if c.state == "not_reproduced"),
            # GPU-hours decided not to spend: the estimates of the runs decided not reproduced
            "decided_not_spent_gpu_hours": (_sum_known(c.estimated_gpu_hours for c in cells
                                                       if c.state == "not_reproduced")
                                            if any(c.state == "not_reproduced" for c in cells) else 0.0),
            "hung_runs": ledger.hung_count(exp.id, cutoff=datetime.fromtimestamp(now - hung_after, tz=UTC))
            if any(c.state == "running" for c in cells) else 0,
            "hung_after_seconds": hung_after,
            "decisions": [decision_row(d) for d in ledger.decisions(exp.name)],
            # its canaries while they matter here: runs held for one, or cancelled by one that failed
            # (control/canary.py); the report shows them always
            "canaries": [{"key": c.key, "state": c.state, "reason": c.reason, "shape": dict(c.shape)}
                         for c in ledger.canaries(exp.id)] if any(c.state in (HELD, "cancelled") for c in cells)
            else [],
        }
        present = sorted({c.state for c in cells})  # no query for a state the experiment has no run in
        runs = ledger.status_runs(exp.id, states=present, attention=attention, limit=limit)
        live = {"hung_after": hung_after, "now": now, "evaluations": evaluations}
        yield summary, _rows(runs, exp.queue or "", positions, bounded=limit is not None, live=live)


def _changes(ledger: Ledger, exp: Any, arms: list[str]) -> dict[str, Any]:
    """{"baseline", "changes"} of an experiment version shown with `arms`."""
    spec = ledger.experiment_spec(exp.id) if len(arms) > 1 else {}
    baseline = spec_baseline(spec, arms)
    return {"baseline": baseline, "changes": {arm: arm_changes(spec, arm, baseline) for arm in arms}}


def _provenance(run: Run, extra: dict[str, Any] | None) -> dict[str, Any]:
    """`extra` with the run's provenance (status_runs loaded its provenances)."""
    return {**(extra or {}), "provenance": run.provenances[-1].document if run.provenances else None}


def _rows(runs: Iterator[Run], queue: str, positions: Positions | None, *, bounded: bool,
          live: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if positions is None:
        yield from (run_row(r, _provenance(r, None), **live) for r in runs)
        return
    if bounded:  # a page: ask Redis about exactly its queued runs
        page = list(runs)
        queued = [r.run_key for r in page if r.state == "queued"]
        extra = positions(queue, queued) if queued else {}
        yield from (run_row(r, _provenance(r, extra.get(r.run_key)), **live) for r in page)
        return
    extra_all: dict[str, dict[str, Any]] | None = None  # every run: read Redis' id lists once
    for r in runs:
        if r.state == "queued" and extra_all is None:
            extra_all = positions(queue, None)
        yield run_row(r, _provenance(r, (extra_all or {}).get(r.run_key)), **live)


def experiment_status(ledger: Ledger, **kwargs: Any) -> list[dict[str, Any]]:
    """`iter_experiment_status` with the rows in each experiment's "runs" list."""
    return [{**summary, "runs": list(rows)} for summary, rows in iter_experiment_status(ledger, **kwargs)]


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


def continuations(run: Run) -> int:
    """How many times the run has continued past a time limit: its attempts that ended `timeout`,
    but the last one when the run itself ended `timeout` (that one ended it)."""
    timeouts = sum(1 for a in run.attempts if a.state == "timeout")
    return max(0, timeouts - 1) if run.state == "timeout" else timeouts


def continuation_label(run: Run) -> str | None:
    """`continued after time limit (2 of 3)`, for a run that has continued; else None."""
    n = continuations(run)
    if not n:
        return None
    return f"continued after time limit ({n} of {run_lifecycle(run.run_spec)[1]})"
