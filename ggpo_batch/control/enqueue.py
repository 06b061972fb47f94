"""Enqueue: spec -> preflight -> cost guard -> ledger (runs queued) -> RQ jobs. Idempotent on the spec hash.

The ledger is written before Redis: a crash in between leaves runs queued in the ledger with no
job, which `reconcile` puts back on the queue. Nothing is queued over a cost cap unless the
cost is accepted with a reason; the refusal itself is a ledger decision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import Settings, fault_pause
from ..contracts.arm_train import arm_changes
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec, config_hash
from ..contracts.states import HELD
from ..errors import CostCapExceeded, SpecError
from ..ledger import Ledger, NewRun
from ..spec import preflight
from ..spec.parse import ExperimentSpec, spec_diff
from . import canary, costguard, waves
from .queue import RunQueue

log = logging.getLogger(__name__)


@dataclass
class EnqueueResult:
    experiment: str
    version: int
    queue: str
    runs: list[RunSpec]
    new_runs: list[str] = field(default_factory=list)
    enqueued: int = 0
    dry_run: bool = False
    estimate: costguard.Estimate | None = None
    cap: costguard.CapCheck | None = None
    # Runs already queued in the ledger that Redis did not hold (an earlier enqueue that failed on
    # Redis, a Redis restart), put back on the queue by this enqueue.
    restored: int = 0
    preflight: preflight.Report | None = None  # what preflight checked and measured
    held: list[str] = field(default_factory=list)  # new runs recorded held, not queued (control/holds.py)
    # canaries started by this enqueue (control/canary.py), and with --dry-run those it would start
    canaries: list[str] = field(default_factory=list)


def new_run(r: RunSpec, est: dict[str, float], priority: str = DEFAULT_PRIORITY) -> NewRun:
    d = r.to_dict()
    return NewRun(run_key=r.run_key, arm=r.arm.name, seed=r.seed, config_hash=config_hash(d), run_spec=d,
                  retries_allowed=r.retries, estimated_gpu_hours=est.get(r.run_key), priority=priority)


def new_experiment(spec: ExperimentSpec, version: int, queue: str) -> dict[str, Any]:
    """The experiment row's fields for `spec` at `version`, booked on `queue`."""
    return {"name": spec.name, "version": version, "method": spec.method, "source": "spec",
            "spec_hash": spec.spec_hash, "spec": spec.canonical(), "gpus": spec.gpus, "source_path": spec.path,
            "queue": queue, "max_gpu_hours": spec.max_gpu_hours}


def arm_rows(spec: ExperimentSpec, res: EnqueueResult) -> list[dict[str, Any]]:
    """Per arm of the runs expanded (`enqueue --dry-run`): its name, whether the sweep made it, what it
    changes against the baseline, its runs and their estimated GPU-hours."""
    canonical, baseline, swept = spec.canonical(), spec.baseline_arm, set(spec.swept_arms)
    hours = {e.run_key: e.gpu_hours for e in res.estimate.runs} if res.estimate else {}
    out: dict[str, dict[str, Any]] = {}
    for r in res.runs:
        row = out.setdefault(r.arm.name, {"name": r.arm.name, "swept": r.arm.name in swept,
                                          "baseline": r.arm.name == baseline, "runs": 0, "estimated_gpu_hours": None,
                                          "changes": arm_changes(canonical, r.arm.name, baseline)})
        row["runs"] += 1
        if r.run_key in hours:
            row["estimated_gpu_hours"] = (row["estimated_gpu_hours"] or 0.0) + hours[r.run_key]
    return list(out.values())


def enqueue_spec(ledger: Ledger, settings: Settings, spec: ExperimentSpec, *, arms: Sequence[str] | None = None,
                 seeds: Sequence[int] | None = None, queue: str | None = None, dry_run: bool = False,
                 new_version: bool = False, accept_cost_reason: str | None = None,
                 actor: str, priority: str | None = None, hold: bool = False) -> EnqueueResult:
    """Put the spec's runs (or a subset) on the queue; see the module docstring. `priority` (default:
    the spec's) is stored with each new run and picks the queue it waits on. With `hold`, the new
    runs are recorded `held` and none goes on the queue (`res.held`) until `holds.release`. A
    sequential [power] design queues its first wave's runs and holds the later waves' (`res.held`):
    reconcile releases each wave after the look at the one before (control/waves.py); the cost
    guard prices all of its seeds now."""
    priority = priority or spec.priority
    waves.check_seeds(spec, seeds)
    # What would fail on the allocation fails here, before the ledger or the queue is touched.
    report = preflight.require(spec, arms=list(arms) if arms else None)
    queue_name = queue or settings.queue_for(spec.queue)
    # Check and write under one lock: two enqueues that each fit a cap must not both pass it.
    with ledger.exclusive("enqueue") if not dry_run else nullcontext():
        latest = ledger.latest_experiment(spec.name)
        if latest is not None and latest.spec_hash != spec.spec_hash and latest.source == "spec":
            if not new_version:
                diff = spec_diff(latest.spec, spec.canonical())
                raise SpecError(spec.path, "", f"experiment {spec.name!r} v{latest.version} exists with a different "
                                f"spec ({'; '.join(diff[:8])}); pass --new-version to start v{latest.version + 1}")
        elif latest is not None and latest.source != "spec":
            raise SpecError(spec.path, "experiment.name",
                            f"{spec.name!r} is an imported experiment; choose another name")
        same = latest is not None and latest.spec_hash == spec.spec_hash
        version = latest.version if same else (latest.version + 1 if latest else 1)
        runs = spec.expand(version, arms=arms, seeds=seeds)
        existing = ledger.run_states(latest.id) if same and latest else {}
        todo = [r for r in runs if r.run_key not in existing]
        decided = [r for r in runs if existing.get(r.run_key) == "not_reproduced"]
        est = costguard.estimate(ledger, spec, todo + decided)
        # A canary per shape before the sweep (control/canary.py): its allocations priced with the runs.
        gate = canary.gate(ledger, spec, runs, todo + decided, latest.id if same and latest is not None else None)
        est = canary.with_canaries(est, gate)
        cap = costguard.check_caps(ledger, spec, est, settings=settings, user=actor, queue=queue_name)
        if not dry_run:
            fault_pause(settings, "after_cost_check")
        res = EnqueueResult(spec.name, version, queue_name, runs, [r.run_key for r in todo], 0, dry_run, est, cap,
                            preflight=report)
        # Held runs stay off the queue (a decided run the accepted cost moves back to queued goes on it):
        # every new run with `hold`, else a sequential design's runs of the waves not reached yet.
        held = ({r.run_key for r in todo} if hold
                else waves.later_wave_keys(ledger, spec, todo + decided,
                                           latest.id if same and latest is not None else None))
        if gate is not None:
            held |= gate.held
            res.canaries = [c.key for c in gate.new]
        res.held = [r.run_key for r in todo + decided if r.run_key in held]
        if dry_run or not (todo or decided):
            if same and not dry_run and latest is not None:
                res.restored = restore_stranded(ledger, settings, latest, [r.run_key for r in runs])
            return res
        per_run = {e.run_key: e.gpu_hours for e in est.runs}
        if not cap.ok and not accept_cost_reason:
            # The refusal is itself a fact: the experiment and its runs are recorded as not_reproduced.
            costguard.record_not_reproduced(ledger, spec, est, cap, actor=actor,
                                            new_experiment=new_experiment(spec, version, queue_name),
                                            new_runs=[new_run(r, per_run, priority) for r in todo])
            raise CostCapExceeded(f"{spec.path}: {cap.message}; nothing queued. Recorded as not_reproduced_high_cost; "
                                  f"`enqueue --accept-cost --reason TEXT` overrides")
        # Runs decided not reproduced for their cost go back only through an accepted cost (over a cap,
        # or under one with --accept-cost: a refused wave of a sequential design), never silently.
        accepting = not cap.ok or bool(decided and accept_cost_reason)
        if not accepting:
            decided = []
            res.held = [k for k in res.held if k in {r.run_key for r in todo}]
        keys = [r.run_key for r in decided + todo if r.run_key not in held]
        states = [HELD if r.run_key in held else "queued" for r in todo]
        queue = RunQueue.from_url(settings.redis_url, queue_name)
        exp_id = latest.id if same and latest is not None else None
        if todo:
            if same and latest is not None:
                ledger.add_runs(latest.id, [new_run(r, per_run, priority) for r in todo], actor=actor, states=states)
            else:
                exp_id = ledger.create_experiment(**new_experiment(spec, version, queue_name), actor=actor, states=states,
                                                  runs=[new_run(r, per_run, priority) for r in todo]).id
        priorities = {r.run_key: priority for r in todo}
        if accepting:
            # Moves this spec's not_reproduced runs back to queued, in the decision's transaction.
            costguard.record_cost_accepted(ledger, spec, est, cap, actor=actor, reason=accept_cost_reason or "",
                                           hold=[r.run_key for r in decided if r.run_key in held])
            if decided and latest is not None:  # back on the queue with the priority the ledger has for them
                priorities.update((r.run_key, r.priority) for r in ledger.runs(experiment_id=latest.id,
                                                                               states=["queued"], with_attempts=False))
    # Redis only now, after the ledger has committed: a failed ledger write sends nothing.
    if gate is not None and gate.new and exp_id is not None:
        res.canaries = canary.start(ledger, settings, exp_id, gate.new, actor=actor, queue_name=queue_name)
    res.enqueued = queue.enqueue_by_priority((key, priorities.get(key, priority)) for key in keys)
    log.info("enqueued %d run(s) of %s v%d on %s", res.enqueued, spec.name, version, queue_name)
    if same and latest is not None:
        just = set(keys)
        res.restored = restore_stranded(ledger, settings, latest, [r.run_key for r in runs if r.run_key not in just])
    return res


def restore_stranded(ledger: Ledger, settings: Settings, experiment: Any, run_keys: Sequence[str]) -> int:
    """Put back on the queue those of `run_keys` that the ledger has as queued but Redis does not
    hold: the runs of an enqueue that was written to the ledger and then failed on Redis (exit 4),
    so that running the same enqueue again finishes the job instead of reporting nothing to do.
    (reconcile does the same for every queue; this does it at once, for this experiment.)"""
    if settings.inline_queue or not run_keys:
        return 0
    wanted = set(run_keys)
    queued = {r.run_key: r.priority for r in ledger.runs(experiment_id=experiment.id, states=["queued"])
              if r.run_key in wanted and not (r.attempts and r.attempts[-1].state == "submitting")}
    if not queued:
        return 0
    queue = RunQueue.from_url(settings.redis_url, settings.queue_for(experiment.queue))
    present = queue.present()
    missing = [k for k in queued if k not in present]
    if missing:
        queue.forget(missing)
        queue.enqueue_by_priority((k, queued[k]) for k in missing)
        log.warning("enqueue: %d queued run(s) of %s v%d were missing from Redis queue %s; put back",
                    len(missing), experiment.name, experiment.version, queue.name)
    return len(missing)
