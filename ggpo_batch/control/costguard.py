"""Cost guard: estimate a spec's GPU-hours before anything is queued, check the caps, record decisions.

A run costs nodes x GPUs per node x (loop + setup/export + audit + evaluation) / 3600. The overhead outside the loop
comes from the ledger's history when it has one: the median, over past succeeded attempts of the
same method (same GPUs per run, same profile or an imported experiment, which has no profile), of
`elapsed_seconds - result.budget.loop_seconds`. The loop itself is the budget times (1 + the median
overshoot fraction of those attempts): a loop ends at the first batch completed at or after the
budget, so it always runs a little over. Without history the spec's [overheads] are used and the
loop is the budget exactly.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.settings import Settings
from ..contracts.accounting import gpu_hours
from ..contracts.runspec import RunSpec
from ..contracts.states import KIND_COST_ACCEPTED, KIND_NOT_REPRODUCED
from ..errors import LedgerError
from ..ledger import Ledger, NewRun
from ..ledger.schema import Decision, Experiment, Run
from ..spec.experiment import ExperimentSpec

log = logging.getLogger(__name__)

HISTORY_LIMIT = 500  # newest attempts considered; older clusters and code are a worse guide
MANUAL_COST_TYPE = "reported configuration/cost judged by review, not a local full-run measurement"


@dataclass(frozen=True)
class RunEstimate:
    """The estimated cost of one run."""

    run_key: str
    gpus: int  # the whole allocation's: nodes x gpus_per_node
    loop_seconds: float
    overhead_seconds: float
    gpu_hours: float
    basis: str  # "history (median of N attempts)" | "spec overheads"
    nodes: int = 1

    @property
    def shape(self) -> str:
        """`4 GPUs`, or `2 nodes x 4 GPUs` for a multi-node allocation."""
        return f"{self.gpus} GPUs" if self.nodes == 1 else f"{self.nodes} nodes x {self.gpus // self.nodes} GPUs"


@dataclass(frozen=True)
class Estimate:
    """The estimated cost of a set of runs, with where the figures came from."""

    runs: tuple[RunEstimate, ...]
    total_gpu_hours: float
    cost_type: str
    cost_basis: str


@dataclass(frozen=True)
class History:
    """What past attempts of a method say about the time outside (and past) the loop budget."""

    attempts: int
    overhead_seconds: float
    overshoot_fraction: float


@dataclass(frozen=True)
class CapCheck:
    """The outcome of checking an estimate against every cap; `cap_name` is the cap broken (or the tightest)."""

    ok: bool
    cap_name: str | None
    cap_gpu_hours: float | None
    available_gpu_hours: float | None
    message: str


def _profile_matches(exp: Experiment, run: Run, profile: str) -> bool:
    # Imported experiments carry no profile: they count as history for every profile.
    return exp.source == "import" or (run.run_spec or {}).get("profile") == profile


def history(ledger: Ledger, *, method: str, profile: str, gpus: int) -> History | None:
    """Medians over the ledger's succeeded attempts of `method` on `gpus` GPUs (an attempt's whole
    allocation, all nodes); None without any."""
    overheads: list[float] = []
    overshoots: list[float] = []
    for exp, run, att in ledger.succeeded_attempts(method=method, gpus=gpus, limit=HISTORY_LIMIT):
        budget = (run.result or {}).get("budget") or {}
        loop, target = budget.get("loop_seconds"), budget.get("budget_seconds")
        if not _profile_matches(exp, run, profile) or not isinstance(loop, (int, float)):
            continue
        elapsed = float(att.elapsed_seconds)
        if not (math.isfinite(loop) and 0 < loop <= elapsed):
            log.warning("run %s attempt %d: loop %r s vs elapsed %r s, left out of history",
                        run.run_key, att.number, loop, elapsed)
            continue
        overheads.append(elapsed - loop)
        if isinstance(target, (int, float)) and target > 0:
            overshoots.append(max(0.0, (loop - target) / target))
    if not overheads:
        return None
    return History(attempts=len(overheads), overhead_seconds=statistics.median(overheads),
                   overshoot_fraction=statistics.median(overshoots) if overshoots else 0.0)


def estimate(ledger: Ledger, spec: ExperimentSpec, runs: Sequence[RunSpec]) -> Estimate:
    """GPU-hours of `runs` (expanded from `spec`), from the ledger's history or the spec's overheads."""
    hist: dict[int, History | None] = {}
    out = []
    for r in runs:
        g = r.allocated_gpus  # nodes x gpus per node: attempts are booked with the same count
        if g not in hist:
            hist[g] = history(ledger, method=spec.method, profile=r.profile, gpus=g)
        h = hist[g]
        if h is not None:
            loop = r.loop_budget_seconds * (1.0 + h.overshoot_fraction)
            overhead, basis = h.overhead_seconds, f"history (median of {h.attempts} attempts)"
        else:
            loop, overhead, basis = r.loop_budget_seconds, spec.overheads.total_seconds, "spec overheads"
        out.append(RunEstimate(run_key=r.run_key, gpus=g, loop_seconds=loop, overhead_seconds=overhead,
                               gpu_hours=gpu_hours(g, loop + overhead), basis=basis, nodes=r.nodes))
    total = math.fsum(e.gpu_hours for e in out)
    used = {g: h for g, h in hist.items() if h is not None}
    if used:
        n = sum(h.attempts for h in used.values())
        cost_type = (f"estimated from ledger history (median of {n} past {spec.method} attempts), "
                     "not a measurement of this experiment")
    else:
        cost_type = f"estimated from the spec's [overheads] (no ledger history of {spec.method}), not a measurement"
    return Estimate(runs=tuple(out), total_gpu_hours=total, cost_type=cost_type,
                    cost_basis=_basis(spec, out, hist, total))


def _basis(spec: ExperimentSpec, runs: Sequence[RunEstimate], hist: dict[int, History | None], total: float) -> str:
    parts = []
    for g, h in sorted(hist.items()):
        mine = [e for e in runs if e.gpus == g]
        e = mine[0]
        if h is not None:
            src = (f"median overshoot {h.overshoot_fraction:.2%}, median overhead {h.overhead_seconds:.0f} s over "
                   f"{h.attempts} succeeded {spec.method} attempts on {g} GPUs (profile {spec.profile} or imported)")
        else:
            o = spec.overheads
            src = (f"spec overheads setup/export {o.setup_export_seconds:.0f} + audit {o.audit_seconds:.0f} "
                   f"+ evaluation {o.evaluation_seconds:.0f} s")
        parts.append(f"{len(mine)} runs x {e.shape} x ({e.loop_seconds:.0f} s loop + {e.overhead_seconds:.0f} s "
                     f"overhead) / 3600, from {src}")
    if not parts:
        return "no runs"
    return f"{total:.2f} GPU-h = " + "; ".join(parts)


def check_caps(ledger: Ledger, spec: ExperimentSpec, est: Estimate, *, settings: Settings, user: str,
               queue: str) -> CapCheck:
    """Check `est` against the experiment cap (spec), the user's and the queue's (settings).

    User and queue caps count what is already spent (every attempt's GPU-hours) plus what is in
    flight (estimates of queued, submitted and running runs) plus this estimate.
    """
    need = est.total_gpu_hours
    caps: list[tuple[str, float, float]] = []  # (name, cap, available before this)
    if spec.max_gpu_hours is not None:
        caps.append(("experiment", spec.max_gpu_hours, spec.max_gpu_hours))
    if settings.user_gpu_hours_cap is not None:
        spent, flight = ledger.committed_gpu_hours(user=user)
        caps.append((f"user {user}", settings.user_gpu_hours_cap, settings.user_gpu_hours_cap - spent - flight))
    if settings.queue_gpu_hours_cap is not None:
        spent, flight = ledger.committed_gpu_hours(queue=queue)
        caps.append((f"queue {queue}", settings.queue_gpu_hours_cap, settings.queue_gpu_hours_cap - spent - flight))
    if not caps:
        return CapCheck(True, None, None, None, f"{need:.2f} GPU-h estimated; no cap is set")
    over = [c for c in caps if need > c[2]]
    if over:
        lines = [f"{n} cap {cap:.2f} GPU-h has {avail:.2f} left" for n, cap, avail in over]
        name, cap, avail = over[0]
        return CapCheck(False, name, cap, avail,
                        f"estimated {need:.2f} GPU-h is over the " + "; the ".join(lines))
    name, cap, avail = min(caps, key=lambda c: c[2])
    return CapCheck(True, name, cap, avail,
                    f"estimated {need:.2f} GPU-h fits: {avail - need:.2f} GPU-h to spare under the {name} cap "
                    f"({cap:.2f})")


def check_continuation(ledger: Ledger, run: Run, *, spent_now: float, remaining_loop_seconds: float,
                       settings: Settings | None = None) -> CapCheck:
    """May `run` continue past its time limit in one more allocation? Its estimate: the loop seconds
    it has left plus the overhead outside the loop (from the run's own estimate; the spec's default
    overheads without one). Checked against the experiment's cap and, with `settings`, the user's
    and the queue's: what each has spent, with `spent_now` (the attempt that just ended, not yet
    booked), plus the other unfinished runs' estimates; this run's own estimate is replaced by what
    it spent and this continuation."""
    from ..spec.experiment import Overheads

    exp = run.experiment
    gpus = run.attempts[-1].gpus if run.attempts else exp.gpus
    budget = float((run.run_spec or {}).get("loop_budget_seconds") or 0.0)
    if run.estimated_gpu_hours is not None and gpus:
        overhead = max(0.0, run.estimated_gpu_hours * 3600.0 / gpus - budget)
    else:
        overhead = Overheads().total_seconds
    need = gpu_hours(gpus, remaining_loop_seconds + overhead)
    mine = run.estimated_gpu_hours or 0.0
    scopes: list[tuple[str, float, dict[str, Any]]] = []
    if exp.max_gpu_hours is not None:
        scopes.append(("experiment", exp.max_gpu_hours, {"experiment_id": exp.id}))
    if settings is not None and settings.user_gpu_hours_cap is not None:
        scopes.append((f"user {exp.created_by}", settings.user_gpu_hours_cap, {"user": exp.created_by}))
    if settings is not None and settings.queue_gpu_hours_cap is not None:
        queue = settings.queue_for(exp.queue)
        scopes.append((f"queue {queue}", settings.queue_gpu_hours_cap, {"queue": queue}))
    what = f"continuation estimated at {need:.3f} GPU-h ({remaining_loop_seconds:.0f} s loop + {overhead:.0f} s overhead)"
    if not scopes:
        return CapCheck(True, None, None, None, f"{what}; no cap is set")
    caps = []
    for name, cap, scope in scopes:
        spent, flight = ledger.committed_gpu_hours(**scope)
        caps.append((name, cap, cap - spent - spent_now - max(0.0, flight - mine)))
    over = [c for c in caps if need > c[2]]
    if over:
        name, cap, avail = over[0]
        return CapCheck(False, name, cap, avail, f"{what} is over the {name} cap {cap:.2f} GPU-h, which has "
                                                 f"{avail:.3f} left")
    name, cap, avail = min(caps, key=lambda c: c[2])
    return CapCheck(True, name, cap, avail, f"{what} fits under the {name} cap ({avail - need:.3f} GPU-h to spare)")


def _available(check: CapCheck) -> str:
    if check.cap_name is None:
        return "no cap set"
    return (f"{check.available_gpu_hours:.2f} GPU-h left under the {check.cap_name} cap "
            f"of {check.cap_gpu_hours:.2f} GPU-h")


def _same_experiment(ledger: Ledger, spec: ExperimentSpec) -> Experiment | None:
    exp = ledger.latest_experiment(spec.name)
    return exp if exp is not None and exp.spec_hash == spec.spec_hash else None


def record_not_reproduced(ledger: Ledger, spec: ExperimentSpec, est: Estimate, check: CapCheck, *, actor: str,
                          new_experiment: Mapping[str, Any] | None = None,
                          new_runs: Sequence[NewRun] = ()) -> Decision:
    """The automatic decision not to run `spec` because of its cost (review_done False, no automatic retry).

    With `new_experiment` and `new_runs` (built by enqueue), and no experiment of the same spec in
    the ledger yet, the experiment is created with those runs in `not_reproduced` (in the same
    transaction), so `status` lists them as decided; an existing experiment of the same spec has
    its queued runs moved there instead.
    """
    fields: dict[str, Any] = {
        **_cost_fields(est, check), "review_done": False, "automatic_retry": False,
        "resolution": (f"not reproduced: high cost ({check.cap_name or 'no'} cap); nothing queued, no GPU spent; "
                       "override with `enqueue --accept-cost --reason TEXT`"),
        "reason": check.message,
    }
    existing = _same_experiment(ledger, spec)
    if existing is not None or new_experiment is None or not new_runs:
        d, _ = ledger.apply_decision(experiment_name=spec.name, kind=KIND_NOT_REPRODUCED, actor=actor, fields=fields,
                                     experiment_id=existing.id if existing else None,
                                     run_state="not_reproduced" if existing else None)
        return d
    d, _ = ledger.apply_decision(experiment_name=spec.name, kind=KIND_NOT_REPRODUCED, actor=actor, fields=fields,
                                 new_experiment=dict(new_experiment), new_runs=list(new_runs))
    return d


def _cost_fields(est: Estimate, check: CapCheck) -> dict[str, Any]:
    return {"estimated_gpu_hours": est.total_gpu_hours, "cap_gpu_hours": check.cap_gpu_hours,
            "cost_basis": est.cost_basis, "cost_type": est.cost_type, "available_budget": _available(check)}


def record_cost_accepted(ledger: Ledger, spec: ExperimentSpec, est: Estimate, check: CapCheck, *, actor: str,
                         reason: str, hold: Sequence[str] = ()) -> Decision:
    """A person accepted the cost (`enqueue --accept-cost --reason`); runs of the same spec that were
    decided not_reproduced go back to queued in the same transaction (the caller then enqueues them),
    those of `hold` (a sequential design's later waves) to held."""
    if not reason or not reason.strip():
        raise LedgerError(f"{spec.path}: accepting a cost over a cap needs --reason TEXT")
    fields: dict[str, Any] = {
        **_cost_fields(est, check), "review_done": True, "automatic_retry": False,
        "resolution": f"cost accepted by {actor} ({check.message}): {reason.strip()}", "reason": reason.strip(),
    }
    existing = _same_experiment(ledger, spec)
    d, _ = ledger.apply_decision(experiment_name=spec.name, kind=KIND_COST_ACCEPTED, actor=actor, fields=fields,
                                 experiment_id=existing.id if existing else None,
                                 run_state="queued" if existing else None, hold=frozenset(hold))
    return d


@dataclass(frozen=True)
class ManualDecision:
    decision: Decision
    runs_not_reproduced: tuple[str, ...]


def decide_not_reproduced(ledger: Ledger, experiment: str, *, actor: str, reason: str, cost_basis: str,
                          cost_type: str | None = None, available_budget: str | None = None,
                          resolution: str | None = None, estimated_gpu_hours: float | None = None) -> ManualDecision:
    """A decision by hand, after review, not to reproduce `experiment` because of its cost.

    If the experiment is in the ledger, its queued runs become not_reproduced; runs that already
    started keep their state (their GPU-hours are spent).
    """
    if not reason.strip():
        raise LedgerError(f"decide {experiment}: --reason must not be empty")
    if not cost_basis.strip():
        raise LedgerError(f"decide {experiment}: --cost-basis must not be empty")
    exp = ledger.latest_experiment(experiment)
    fields: dict[str, Any] = {
        "estimated_gpu_hours": estimated_gpu_hours, "cap_gpu_hours": None, "cost_basis": cost_basis.strip(),
        "cost_type": cost_type or MANUAL_COST_TYPE, "available_budget": available_budget, "review_done": True,
        "automatic_retry": False,
        "resolution": resolution or f"not reproduced: high cost (review done): {reason.strip()}",
        "reason": reason.strip(),
    }
    d, moved = ledger.apply_decision(experiment_name=experiment, kind=KIND_NOT_REPRODUCED, actor=actor, fields=fields,
                                     experiment_id=exp.id if exp else None,
                                     run_state="not_reproduced" if exp else None)
    return ManualDecision(d, tuple(moved))


def describe(est: Estimate, check: CapCheck | None = None) -> list[str]:
    """Lines for `enqueue --dry-run`: per-run estimates, the total and how it was made, the cap check."""
    lines = [f"  {e.run_key}: {e.gpu_hours:.3f} GPU-h  ({e.shape} x ({e.loop_seconds:.0f} + "
             f"{e.overhead_seconds:.0f}) s, {e.basis})" for e in est.runs]
    lines.append(f"estimated total: {est.total_gpu_hours:.2f} GPU-h for {len(est.runs)} runs")
    lines.append(f"  cost type: {est.cost_type}")
    lines.append(f"  cost basis: {est.cost_basis}")
    if check is not None:
        lines.append(("  within caps: " if check.ok else "  OVER A CAP: ") + check.message)
    return lines
