"""Experiment report: per-arm statistics, arm-vs-baseline differences paired by seed, spent and decided totals.

Pure data (dicts), so the CLI prints a table or JSON of the same content and `plots` draws it.
Statistics are {"mean", "std", "n"} as in the seed-003 record; std is the sample std (n - 1),
None for fewer than two values. Step, budget, token and exposure figures come from the run's
result record and count succeeded runs whose rollout audit passed only (a failed run's steps
are not comparable, nor are those of a run whose loss the audit found wrong: such runs are counted
apart, `audit_failed`, per arm and in total); runs whose budget or exposure target was not reached
are counted as `budget_not_reconciled` (their arms may not be compared as matched).
GPU-hours count every run that spent any, failures included, summed over all its attempts.

Outcomes (`ggpo_batch/contracts/outcome.py`: the evaluation's rewards, booked per run by settlement) are
summarised per arm with a 95 % confidence interval (`ci95` beside `mean`, `ci95_method` says which:
`stats.py`), and differenced against the baseline arm paired by seed, on the same items: an arm's
reward on the items it trained on minus the baseline run's reward on those items. `warnings` lists
what makes the arms not comparable (`fairness.comparability_warnings`, and
`provenance_checks`: runs that ran other code, environment or hardware); a report on a fair
experiment has none, unless its `[power]` table declares an effect its seeds were `underpowered`
for. `power` (powered.py): per arm the smallest difference the seeds run could detect, and the type S
and M errors at the declared effect. `compare.compare_reports` puts two reports side by side.

Outcome sets: the figures come from the training allocation's own evaluation (`outcome_set`
"training", `runs.outcome`), or with `outcomes=NAME` from an evaluation after training (the
`evaluations` table, ggpo_batch/control/evaluations.py), summarised and paired the same way. An arm's
training figures (cost, attempts, retries) count its training attempts only; the GPU-hours of
evaluations after training are `totals.evaluation_gpu_hours`, within `spent_gpu_hours`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..contracts.accounting import attempt_gpu_hours
from ..contracts.arm_train import arm_changes
from ..contracts.evaluation_spec import TRAINING_OUTCOME_SET
from ..contracts.outcome import OUTCOME_METRICS, matched_difference
from ..contracts.run_record import (
    PAIRED_RECORD_METRICS,
    audit_failed,
    budget_reconciled,
)
from ..contracts.runspec import DEFAULT_BASELINE, spec_baseline
from ..contracts.states import (
    ATTEMPT_KIND_EVALUATION,
    HELD,
    KIND_NOT_REPRODUCED,
    TRAINING_ATTEMPT_KINDS,
)
from ..errors import LedgerError
from ..ledger import Ledger
from ..ledger.schema import Run
from . import stats
from .canary_view import canary_line, canary_rows
from .fairness import comparability_warnings, notes
from .powered import power_block, with_recorded
from .provenance_checks import provenance_notes, provenance_warnings
from .status import decision_row

EXPOSURE_KEYS = ("actual_exposed", "target_exposed", "exposed_with_nonzero_advantage", "shared_groups",
                 "shared_trajectories")
EVALUATION_KINDS = frozenset({ATTEMPT_KIND_EVALUATION})
# Per-seed metrics differenced against the baseline arm.
PAIRED_METRICS = PAIRED_RECORD_METRICS



def stat(values: Iterable[float]) -> dict[str, Any]:
    """{"mean", "std", "n"}: fsum mean (order independent), sample std, None where undefined."""
    xs = list(values)
    n = len(xs)
    if n == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": math.fsum(xs) / n, "std": statistics.stdev(xs) if n > 1 else None, "n": n}


def _with_total(values: Sequence[float]) -> dict[str, Any]:
    return {**stat(values), "total": math.fsum(values)}


def run_gpu_hours(run: Run, kinds: frozenset[str] = TRAINING_ATTEMPT_KINDS) -> float | None:
    """GPU-hours booked for a run's training: every training attempt's figure (the scheduler's, else
    the job's own); with `kinds`, those attempts' (evaluations after training: their own total)."""
    costs = [c for c in (attempt_gpu_hours(a.gpu_hours_job, a.gpu_hours_scheduler) for a in run.attempts
                         if a.kind in kinds) if c is not None]
    return math.fsum(costs) if costs else None


def _training(run: Run) -> list[Any]:
    """The run's attempts that trained it (not its evaluations after training)."""
    return [a for a in run.attempts if a.kind in TRAINING_ATTEMPT_KINDS]


def _resources(run: Run) -> tuple[str, str, int | None]:
    """What a run ran on, as far as the ledger knows it: (executor, profile, GPUs). The GPU model is
    not recorded anywhere (the profile may constrain it), so nothing here invents one."""
    spec = run.run_spec or {}
    executors = sorted({a.executor for a in _training(run)}) or [str(spec.get("executor", "?"))]
    return ",".join(executors), str(spec.get("profile", "?")), spec.get("gpus")


def _per_run(run: Run, outcome: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The figures of one run the report aggregates (None where the run has no result record)."""
    finished = run.result if run.state == "succeeded" and run.result else None
    spec = run.run_spec or {}
    out: dict[str, Any] = {"seed": run.seed, "state": run.state, "allocated_gpu_hours": run_gpu_hours(run),
                           "attempts": len(_training(run)), "audit_failed": audit_failed(finished),
                           "budget_reconciled": budget_reconciled(finished) if finished else None,
                           "attempt_states": [a.state for a in _training(run)], "resources": _resources(run),
                           "budget_seconds": spec.get("loop_budget_seconds")}
    res = finished if finished and not out["audit_failed"] else None
    if res is None:
        return out
    tr, bu, ti = res.get("training", {}), res.get("budget", {}), res.get("timing", {})
    out["budget_seconds"] = bu.get("budget_seconds", out["budget_seconds"])
    out["time_budget_reached"] = bu.get("time_budget_reached")
    out["exposure_target_reached"] = bu.get("exposure_target_reached")
    out["outcome"] = dict(outcome) if outcome else None
    counts = tr.get("counts", {})
    out.update(steps=counts.get("steps"), overshoot_fraction=bu.get("overshoot_fraction"),
               loop_seconds=bu.get("loop_seconds"), elapsed_seconds=ti.get("elapsed_seconds"),
               tokens={k: v for k, v in tr.get("cost", {}).items() if isinstance(v, (int, float))},
               exposure={k: counts.get(k, bu.get(k)) for k in EXPOSURE_KEYS if counts.get(k, bu.get(k)) is not None},
               exposure_templates=dict(bu.get("exposure_templates") or {}))
    out["tokens"]["nonzero_advantage_tokens"] = counts.get("nonzero_advantage_tokens")
    out["tokens"] = {k: v for k, v in out["tokens"].items() if v is not None}
    return out


def _values(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    return [r[key] for r in rows if r.get(key) is not None]


def padding_ratio(ok: Sequence[Mapping[str, Any]]) -> float | None:
    """The update's padded tokens over its non-padded ones (`rl_sequence_padded_tokens` /
    `rl_sequence_nonpadding_tokens`), summed over the runs that have both: what padding cost the
    forward/backward passes (1 = none); None without such runs."""
    have = [r["tokens"] for r in ok if r["tokens"].get("rl_sequence_padded_tokens") is not None
            and r["tokens"].get("rl_sequence_nonpadding_tokens")]
    if not have:
        return None
    return sum(t["rl_sequence_padded_tokens"] for t in have) / sum(t["rl_sequence_nonpadding_tokens"] for t in have)


def _arm_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    states: dict[str, int] = defaultdict(int)
    for r in rows:
        states[r["state"]] += 1
    ok = [r for r in rows if "steps" in r]
    token_keys = sorted({k for r in ok for k in r["tokens"]})
    exposure_keys = [k for k in EXPOSURE_KEYS if any(k in r["exposure"] for r in ok)]
    templates: dict[str, int] = defaultdict(int)
    for r in ok:
        for t, n in r["exposure_templates"].items():
            templates[t] += n
    return {
        "runs": len(rows),
        "states": dict(sorted(states.items())),
        "audit_failed": sum(1 for r in rows if r["audit_failed"]),
        "budget_not_reconciled": sum(1 for r in rows if r["budget_reconciled"] is False),
        "attempts": sum(r["attempts"] for r in rows),
        "steps": stat(_values(ok, "steps")),
        "allocated_gpu_hours": _with_total(_values(rows, "allocated_gpu_hours")),
        "overshoot_fraction": stat(_values(ok, "overshoot_fraction")),
        "loop_seconds": stat(_values(ok, "loop_seconds")),
        "elapsed_seconds": stat(_values(ok, "elapsed_seconds")),
        "tokens": {k: _with_total([r["tokens"][k] for r in ok if k in r["tokens"]]) for k in token_keys},
        "padding_ratio": padding_ratio(ok),
        "exposure": {k: stat([r["exposure"][k] for r in ok if k in r["exposure"]]) for k in exposure_keys},
        "exposure_templates": dict(sorted(templates.items())),
        **_arm_outcome(ok),
        "per_seed": {str(r["seed"]): {**{k: r.get(k) for k in ("state", "audit_failed", "budget_reconciled", "steps",
                                                                "allocated_gpu_hours", "overshoot_fraction",
                                                                "loop_seconds")},
                                      **{m: (r.get("outcome") or {}).get(m) for m in OUTCOME_METRICS}}
                     for r in rows},
    }


def _arm_outcome(ok: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An arm's outcome figures over its comparable runs: each metric's summary with its 95 %
    interval, the same per GPU-hour spent, how the answers were decoded, and how many runs have none."""
    have = [r for r in ok if r.get("outcome")]
    per_gpu_hour: dict[str, Any] = {}
    for m in OUTCOME_METRICS:
        per_gpu_hour[m] = stats.summary(r["outcome"][m] / r["allocated_gpu_hours"] for r in have
                                        if r["outcome"].get(m) is not None and r.get("allocated_gpu_hours"))
    decodings = sorted({f"{r['outcome'].get('decoding')}" + (f" x{r['outcome'].get('samples')} at T="
                                                              f"{r['outcome'].get('temperature')}"
                                                              if r["outcome"].get("decoding") == "sampled" else "")
                        for r in have})
    return {
        "outcome": {m: stats.summary(r["outcome"].get(m) for r in have) for m in OUTCOME_METRICS},
        "outcome_per_gpu_hour": per_gpu_hour,
        "outcome_runs": len(have),
        "no_outcome_runs": len(ok) - len(have),
        "eval_items": stats.summary(r["outcome"].get("items") for r in have),
        "eval_exposed_items": stats.summary(r["outcome"].get("exposed_items") for r in have),
        "decoding": decodings,
        "budget_seconds": stats.summary(r.get("budget_seconds") for r in ok),
    }


def _paired(by_arm: Mapping[str, Sequence[Mapping[str, Any]]], baseline: str) -> dict[str, Any]:
    base = {r["seed"]: r for r in by_arm.get(baseline, ()) if "steps" in r}
    out: dict[str, Any] = {}
    for arm, rows in sorted(by_arm.items()):
        if arm == baseline:
            continue
        mine = {r["seed"]: r for r in rows if "steps" in r}
        seeds = sorted(set(mine) & set(base))
        diffs: dict[str, Any] = {"seeds": seeds}
        keys = list(PAIRED_METRICS) + sorted({k for s in seeds for k in mine[s]["tokens"]
                                               if k in base[s]["tokens"]})
        for key in keys:
            per_seed = {}
            for s in seeds:
                a = mine[s]["tokens"].get(key) if key not in PAIRED_METRICS else mine[s].get(key)
                b = base[s]["tokens"].get(key) if key not in PAIRED_METRICS else base[s].get(key)
                if a is not None and b is not None:
                    per_seed[str(s)] = a - b
            diffs[key] = {**stats.summary(per_seed.values()), "per_seed": per_seed}
        for metric in OUTCOME_METRICS:
            per_seed, matched = {}, True
            for s in seeds:
                mo, bo = mine[s].get("outcome"), base[s].get("outcome")
                if mo and bo:
                    d, same_items = matched_difference(mo, bo, metric)
                    matched = matched and same_items
                    if d is not None:
                        per_seed[str(s)] = d
            if per_seed:
                diffs[metric] = {**stats.summary(per_seed.values()), "per_seed": per_seed, "items_matched": matched}
        out[arm] = diffs
    return out


def _held_notes(runs: Sequence[Run], name: str, exp: Any) -> list[str]:
    """Runs held off the queue (a canary's, a later wave's): not failed, not run yet."""
    held = sum(1 for r in runs if r.state == HELD)
    if not held:
        return []
    return [f"{held} of {len(runs)} runs are held (in the ledger, not queued: waiting for a canary or an earlier "
            f"wave); `ggpo-batch release {name}@{exp.version}` queues them, `ggpo-batch cancel` cancels them"]


def _decided_not_spent(runs: Sequence[Run], decisions: Sequence[Any]) -> float | None:
    decided = [r for r in runs if r.state == "not_reproduced"]
    if decided:
        known = [r.estimated_gpu_hours for r in decided if r.estimated_gpu_hours is not None]
        return math.fsum(known) if known else None
    if decisions and decisions[-1].kind == KIND_NOT_REPRODUCED and not any(r.attempts for r in runs):
        return decisions[-1].estimated_gpu_hours
    return 0.0


def _outcomes(ledger: Ledger, exp: Any, name: str | None) -> tuple[str, list[str], dict[int, dict[str, Any]]]:
    """(the outcome set read, every set the version has, run id -> outcome): `name` None or
    "training" is the training allocation's own evaluation; another, an evaluation after training."""
    sets = [TRAINING_OUTCOME_SET, *ledger.outcome_set_names(exp.id)] if exp is not None else [TRAINING_OUTCOME_SET]
    name = name or TRAINING_OUTCOME_SET
    if name not in sets:
        raise LedgerError(f"{exp.name} v{exp.version} has no outcome set {name!r} (sets: {', '.join(sets)}; "
                          f"`ggpo-batch evaluate` makes one)")
    if exp is None:
        return name, sets, {}
    return name, sets, ledger.outcomes(exp.id) if name == TRAINING_OUTCOME_SET else ledger.outcome_set(exp.id, name)


def experiment_baseline(ledger: Ledger, exp: Any, arms_run: Sequence[str],
                        spec: Mapping[str, Any] | None = None) -> str:
    """The baseline of a ledger experiment: its spec's `[experiment] baseline`, else the default
    resolution over the spec's arms in their order (an imported record: the arms it ran)."""
    return spec_baseline(ledger.experiment_spec(exp.id) if spec is None else spec, arms_run)


def experiment_report(ledger: Ledger, experiment: str, *, version: int | None = None,
                      baseline: str | None = None, outcomes: str | None = None) -> dict[str, Any]:
    """The report of one experiment version (default: the latest); decisions alone if it never ran.
    `baseline`: the arm the others are paired against (default: the spec's, `experiment_baseline`).
    `outcomes`: the outcome set the outcome figures come from (default: the training allocation's own
    evaluation; else an evaluation after training, `ggpo-batch evaluate --name`)."""
    versions = ledger.experiments(experiment)
    decisions = ledger.decisions(experiment)
    if not versions and not decisions:
        raise LedgerError(f"no experiment {experiment!r} in the ledger (and no decision about it)")
    exp = None
    if versions:
        exp = versions[-1] if version is None else next((e for e in versions if e.version == version), None)
        if exp is None:
            have = ", ".join(str(e.version) for e in versions)
            raise LedgerError(f"experiment {experiment!r} has no version {version} (versions: {have})")
    elif version is not None:
        raise LedgerError(f"experiment {experiment!r} was decided, never put in the ledger: it has no versions")
    runs = ledger.runs(experiment_id=exp.id) if exp is not None else []
    outcome_set, outcome_sets, by_run = _outcomes(ledger, exp, outcomes)
    rows = [_per_run(r, by_run.get(r.id)) for r in runs]
    provenance = ledger.latest_provenance(r.id for r in runs) if runs else {}
    for run, row in zip(runs, rows):
        row["provenance_attempt"], row["provenance"] = provenance.get(run.id, (None, None))
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run, row in zip(runs, rows):
        by_arm[run.arm].append(row)
    mine = [d for d in decisions if exp is None or d.experiment_id in (None, exp.id)]
    spent = [r["allocated_gpu_hours"] for r in rows if r["allocated_gpu_hours"] is not None]
    evaluation_spent = math.fsum(h for r in runs if (h := run_gpu_hours(r, EVALUATION_KINDS)) is not None)
    canaries = canary_rows(ledger, exp.id) if exp is not None else []
    canary_spent = math.fsum(c["gpu_hours"] for c in canaries)
    estimates = [r.estimated_gpu_hours for r in runs if r.estimated_gpu_hours is not None]
    spec = ledger.experiment_spec(exp.id) if exp is not None else {}
    if baseline is None:
        baseline = experiment_baseline(ledger, exp, sorted(by_arm), spec) if exp is not None else DEFAULT_BASELINE
    has_baseline = baseline in by_arm
    train = {json.dumps((r.run_spec or {}).get("train") or {}, sort_keys=True) for r in runs}
    # Arms that change [train] run with different tables: the spec's own, their overrides in `changes`.
    common = json.loads(next(iter(train))) if len(train) == 1 else spec.get("train")
    out: dict[str, Any] = {
        "experiment": experiment,
        "version": exp.version if exp else None,
        "method": exp.method if exp else None,
        "source": exp.source if exp else None,
        "gpus": exp.gpus if exp else None,
        "baseline": baseline if baseline in by_arm else None,
        "requested_baseline": baseline,
        "train": common,
        # What each arm changes against the baseline: field -> [baseline's, arm's] (contracts/arm_train.py)
        "changes": {arm: arm_changes(spec, arm, baseline) for arm in sorted(by_arm)},
        "outcome_set": outcome_set,  # whose figures `outcome` shows ("training": the allocation's own)
        "outcome_sets": outcome_sets,
        "warnings": comparability_warnings(by_arm, baseline if has_baseline else None, requested=baseline)
        + provenance_warnings(by_arm, ledger.distributions) if runs else [],
        "notes": notes(by_arm) + provenance_notes(by_arm) + _held_notes(runs, experiment, exp)
        + [canary_line(c, experiment, exp.version) for c in canaries if c["state"] != "passed"],
        # The canaries before the sweep (control/canary.py): state, reason, checks, GPU-hours (in spent too).
        "canaries": canaries,
        "arms": {arm: _arm_summary(rs) for arm, rs in sorted(by_arm.items())},
        "paired_vs_baseline": _paired(by_arm, baseline) if has_baseline else {},
        "totals": {
            "runs": len(runs),
            "audit_failed_runs": sum(1 for r in rows if r["audit_failed"]),
            "budget_not_reconciled_runs": sum(1 for r in rows if r["budget_reconciled"] is False),
            "attempts": sum(r["attempts"] for r in rows),
            "spent_gpu_hours": math.fsum(spent) + evaluation_spent + canary_spent,
            "evaluation_gpu_hours": evaluation_spent,  # of the evaluations after training (in spent too)
            "canary_gpu_hours": canary_spent,  # of the canaries before the sweep (in spent too)
            "decided_not_spent_gpu_hours": _decided_not_spent(runs, mine),
            "decided_runs": sum(1 for r in runs if r.state == "not_reproduced"),
            "estimated_gpu_hours": math.fsum(estimates) if estimates else None,
        },
        "decisions": [decision_row(d) for d in mine],
    }
    # Was it powered: per arm what the seeds run could detect ([power] metric, else eval_reward)
    out["power"], underpowered = power_block(out, spec.get("power"))
    if out["power"] and exp is not None and (spec.get("power") or {}).get("design") == "sequential":
        with_recorded(out["power"], ledger.looks(exp.id))  # the looks reconcile took (control/waves.py)
    out["warnings"] += underpowered
    return out
