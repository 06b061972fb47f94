"""Sequential waves: a `[power] design = "sequential"` experiment runs its seeds in waves, and
reconcile takes a look after each.

- enqueue (`later_wave_keys`): `[experiment] seeds` lists every seed up to the last wave; the first
  wave's runs are queued, the later waves' created `held` (control/holds.py). The cost guard prices
  all of them then (held runs count against the caps).
- reconcile (`take_looks`, once a cycle): when no run of a version is queued or running, its runs of
  the waves so far have ended and a later wave is held, the look is taken per arm against the
  baseline (reporting/sequential.py: the paired t over the seeds of waves 1..k, Lan-DeMets exact t
  boundaries at the per-arm alpha, non-binding futility) and recorded (`Ledger.record_looks`,
  table `sequential_looks`) with its decision, then acted on:
  - crossed (|t| >= the boundary) or futile: the arm's held runs are cancelled with the reason;
  - continue: the next wave's runs of the arms that go on, and the baseline's, are released
    (holds.release), after the cost guard checks that wave again (re-estimated from the history
    now in the ledger, against what every cap has left); a refused wave is `refused`: the seeds
    left are decided not reproduced for their cost (the decision recorded as `decide` would);
  - final: the last look, not crossed (nothing is left to release);
  - when no arm goes on, the baseline's held runs are cancelled too.
  The moves follow the recorded looks, so a cycle that died between recording a look and acting on
  it is finished by the next. A look short of its wave's seeds (a run failed) cannot reject.
- `enqueue --accept-cost` after a refusal (at enqueue, or of a later wave) queues the wave reached
  and holds the later ones again; an arm whose wave was refused goes on from there.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import Settings
from ..contracts.accounting import gpu_hours
from ..contracts.runspec import RunSpec, spec_baseline
from ..contracts.states import HELD, KIND_COST_ACCEPTED, KIND_NOT_REPRODUCED, RECORD_RUN_STATES
from ..errors import GgpoError, SpecError
from ..ledger import Ledger
from ..ledger.schema import Run
from ..reporting import power as pw
from ..reporting import sequential
from ..reporting.powered import design_bounds
from ..reporting.powered import settings as power_settings
from ..spec.experiment import ExperimentSpec
from . import costguard, holds

log = logging.getLogger(__name__)

STOPPED = frozenset({"crossed", "futile", "final", "refused"})


def design(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The [power] settings of a stored (canonical) spec with a sequential design; None otherwise."""
    table = spec.get("power")
    if not isinstance(table, Mapping) or table.get("design") != "sequential" or not table.get("waves"):
        return None
    return power_settings(table)


def check_seeds(spec: ExperimentSpec, chosen: Sequence[int] | None = None) -> None:
    """A sequential design's seeds are those of its waves: no seed past the last wave's, and none
    chosen by hand (`enqueue --seeds`: the waves choose them)."""
    p = spec.power
    if p is None or p.design != "sequential" or not p.waves:
        return
    if chosen:
        raise SpecError(spec.path, "power.design", "--seeds: a sequential design queues its seeds wave by wave "
                        "(the first wave now, the next after each look); enqueue it without --seeds")
    if len(spec.seeds) <= p.waves[-1]:
        return
    raise SpecError(spec.path, "experiment.seeds", f"lists {len(spec.seeds)} seeds; the last wave of power.waves "
                    f"{list(p.waves)} takes {p.waves[-1]}: list the seeds of the waves, in the order they run")


def wave_of(seeds: Sequence[int], waves: Sequence[int], seed: int) -> int:
    """The 1-based wave a seed runs in: its place in the spec's seeds against the waves' sizes."""
    i = list(seeds).index(seed)
    return next(k for k, w in enumerate(waves, 1) if i < w)


def later_wave_keys(ledger: Ledger, spec: ExperimentSpec, runs: Sequence[RunSpec],
                    experiment_id: int | None) -> set[str]:
    """Of `runs` (new runs of `spec`), those to create held: the runs of waves after the one the
    experiment has reached (the first; or, on a version with looks, the one its last look released)."""
    p = spec.power
    if p is None or p.design != "sequential" or not p.waves:
        return set()
    reached = 1
    if experiment_id is not None:  # a refused wave is reached too: enqueue gets here to accept its cost
        looked = [lk["look"] for lk in ledger.looks(experiment_id) if lk["decision"] in ("continue", "refused")]
        reached = max(looked, default=0) + 1
    return {r.run_key for r in runs if wave_of(spec.seeds, p.waves, r.seed) > reached}


@dataclass
class WaveStep:
    """What one cycle did on one experiment version."""

    experiment: str
    version: int
    look: int | None = None  # the look recorded now (None: only the moves of an earlier one)
    decisions: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    not_reproduced: list[str] = field(default_factory=list)


def take_looks(ledger: Ledger, settings: Settings, *, actor: str) -> list[WaveStep]:
    """Reconcile's pass over the versions a look may be due on (module docstring). One version's
    failure is logged and the others go on; a refusal of the ledger (a member's reconcile may not
    record looks: the service does) is logged once per version."""
    done = []
    for exp_id, name, version in ledger.looks_due():
        try:
            with ledger.exclusive("waves"):
                step = advance(ledger, settings, exp_id, name, version, actor=actor)
        except GgpoError as exc:
            log.info("waves %s v%d: %s", name, version, exc.message)
            continue
        except Exception:  # one experiment's look must not stop reconcile
            log.exception("waves %s v%d: the look failed; the other experiments go on", name, version)
            continue
        if step is not None:
            done.append(step)
    return done


def advance(ledger: Ledger, settings: Settings, exp_id: int, name: str, version: int, *,
            actor: str) -> WaveStep | None:
    """Do the moves an experiment version's last look left to do, else take its next look if its
    wave has ended; None when there is nothing to do (not sequential, or a wave still out)."""
    spec = ledger.experiment_spec(exp_id)
    s = design(spec)
    if s is None:
        return None
    waves, seeds = list(s["waves"]), list(spec.get("seeds") or ())
    runs = ledger.runs(experiment_id=exp_id, with_attempts=False)
    baseline = spec_baseline(spec, sorted({r.arm for r in runs}))
    arms = sorted({r.arm for r in runs} - {baseline})
    looks = ledger.looks(exp_id)
    latest: dict[str, dict[str, Any]] = {}
    for lk in looks:
        latest[lk["arm"]] = lk
    accepted = [d.decided_at for d in ledger.decisions(name) if d.experiment_id == exp_id
                and d.kind == KIND_COST_ACCEPTED]
    for arm, lk in list(latest.items()):  # `enqueue --accept-cost` after a refused wave: the arm goes on
        if lk["decision"] == "refused" and accepted and max(accepted) > lk["decided_at"]:
            latest[arm] = {**lk, "decision": "continue"}
    last = max((lk["look"] for lk in looks), default=0)
    step = WaveStep(name, version)
    if last and _moves(ledger, settings, exp_id, name, version, runs, latest, baseline, waves, seeds, last, step,
                       actor=actor):
        return step
    going = [a for a in arms if (not last and a not in latest) or latest.get(a, {}).get("decision") == "continue"]
    if not going or last >= len(waves):
        return None
    k = last + 1
    wave_runs = [r for r in runs if r.arm in {*going, baseline} and r.seed in seeds
                 and wave_of(seeds, waves, r.seed) <= k]
    if not wave_runs or any(r.state not in RECORD_RUN_STATES and r.state != "not_reproduced" for r in wave_runs):
        return None  # the wave is still out (or held by hand: a canary)
    rows = _look(ledger, settings, exp_id, name, version, s, spec, runs, going, baseline, waves, seeds, k)
    ledger.record_looks(exp_id, rows, actor=actor)
    step.look = k
    step.decisions = {r["arm"]: r["decision"] for r in rows}
    for r in rows:
        latest[r["arm"]] = r
    runs = ledger.runs(experiment_id=exp_id, with_attempts=False)
    _moves(ledger, settings, exp_id, name, version, runs, latest, baseline, waves, seeds, k, step, actor=actor)
    log.info("look %d of %d on %s v%d: %s", k, len(waves), name, version,
             ", ".join(f"{a} {d}" for a, d in step.decisions.items()))
    return step


def _look(ledger: Ledger, settings: Settings, exp_id: int, name: str, version: int, s: Mapping[str, Any],
          spec: Mapping[str, Any], runs: Sequence[Run], going: Sequence[str], baseline: str, waves: Sequence[int],
          seeds: Sequence[int], k: int) -> list[dict[str, Any]]:
    """The rows of look `k` over the arms that go on, with their decisions (the next wave's cost
    checked when an arm would go on)."""
    from ..reporting.report import experiment_report

    rep = experiment_report(ledger, name, version=version, baseline=baseline)
    n_arms = len([a for a in (spec.get("arms") or ()) if isinstance(a, Mapping) and a.get("name") != baseline])
    alpha_arm = pw.alpha_per_arm(s["alpha"], n_arms, s["multiplicity"])
    bounds = design_bounds(s, alpha_arm) or []
    upto = {str(x) for x in seeds[: waves[k - 1]]}
    order = {str(x): i for i, x in enumerate(seeds)}
    rows = []
    for arm in going:
        per = ((rep["paired_vs_baseline"].get(arm) or {}).get(s["metric"]) or {}).get("per_seed") or {}
        per = {seed: float(d) for seed, d in sorted(per.items(), key=lambda kv: order.get(kv[0], math.inf))
               if seed in upto and d is not None and math.isfinite(d)}
        got = sequential.look_at(list(per.values()), k, waves, bounds, s["futility"])
        decision, reason = _decision(got, s["metric"], baseline)
        rows.append({"arm": arm, "look": k, "looks": len(waves), "seeds": waves[k - 1], "seeds_paired": got.seeds,
                     "metric": s["metric"], "statistic": got.t, "boundary": got.boundary, "alpha": alpha_arm,
                     "spending": s["spending"], "waves": list(waves), "per_seed": per, "decision": decision,
                     "reason": reason})
    if any(r["decision"] == "continue" for r in rows):
        going_on = {r["arm"] for r in rows if r["decision"] == "continue"} | {baseline}
        nxt = [r for r in runs if r.state == HELD and r.arm in going_on and r.seed in seeds
               and wave_of(seeds, waves, r.seed) == k + 1]
        check = check_wave(ledger, settings, exp_id, nxt)
        if not check.ok:
            for r in rows:
                if r["decision"] == "continue":
                    r["decision"] = "refused"
                    r["reason"] = f"{r['reason']}; wave {k + 1} refused by the cost guard: {check.message}"
    return rows


def _decision(got: sequential.Look, metric: str, baseline: str) -> tuple[str, str]:
    t = "none" if got.t is None else f"{got.t:.4g}"
    at = (f"look {got.look} of {got.looks} on {metric} - {baseline} ({got.seeds} seeds paired): t {t}, boundary "
          + ("none (this look cannot reject)" if got.boundary is None else f"{got.boundary:.4g}"))
    if got.crossed:
        return "crossed", f"{at}: crossed, the arm stops (detected)"
    if got.futile:
        return "futile", f"{at}: futile, the last wave is unlikely to cross its boundary; the arm stops"
    if got.next_wave is None:
        return "final", f"{at}: the last look, not crossed (not detected)"
    return "continue", f"{at}: not crossed; the next wave takes it to {got.next_wave} seeds"


def check_wave(ledger: Ledger, settings: Settings, exp_id: int, runs: Sequence[Run]) -> costguard.CapCheck:
    """The cost guard on a wave about to be released: its runs re-estimated from the ledger's
    history now (the earlier waves' attempts count in it; without history, their enqueue estimate),
    against what the experiment's, its creator's and its queue's caps have left, the wave's own
    estimates (counted as in flight while held) replaced by the new ones."""
    if not runs:
        return costguard.CapCheck(True, None, None, None, "no run to release")
    exp = runs[0].experiment
    need = 0.0
    hist: dict[tuple[str, int], costguard.History | None] = {}
    for r in runs:
        rs = RunSpec.from_dict(r.run_spec)
        key = (rs.profile, rs.allocated_gpus)
        if key not in hist:
            hist[key] = costguard.history(ledger, method=exp.method, profile=rs.profile, gpus=rs.allocated_gpus)
        h = hist[key]
        if h is not None:
            need += gpu_hours(rs.allocated_gpus, rs.loop_budget_seconds * (1 + h.overshoot_fraction)
                              + h.overhead_seconds)
        else:
            need += r.estimated_gpu_hours or 0.0
    reserved = math.fsum(r.estimated_gpu_hours or 0.0 for r in runs)
    scopes: list[tuple[str, float, dict[str, Any]]] = []
    if exp.max_gpu_hours is not None:
        scopes.append(("experiment", exp.max_gpu_hours, {"experiment_id": exp_id}))
    if settings.user_gpu_hours_cap is not None:
        scopes.append((f"user {exp.created_by}", settings.user_gpu_hours_cap, {"user": exp.created_by}))
    if settings.queue_gpu_hours_cap is not None:
        queue = settings.queue_for(exp.queue)
        scopes.append((f"queue {queue}", settings.queue_gpu_hours_cap, {"queue": queue}))
    what = f"the wave's {len(runs)} run(s), estimated at {need:.3f} GPU-h"
    if not scopes:
        return costguard.CapCheck(True, None, None, None, f"{what}; no cap is set")
    caps = []
    for cap_name, cap, scope in scopes:
        spent, flight = ledger.committed_gpu_hours(**scope)
        caps.append((cap_name, cap, cap - spent - max(0.0, flight - reserved)))
    over = [c for c in caps if need > c[2] + 1e-12]
    if over:
        cap_name, cap, avail = over[0]
        return costguard.CapCheck(False, cap_name, cap, avail, f"{what}, are over the {cap_name} cap {cap:.2f} GPU-h, "
                                                              f"which has {max(avail, 0.0):.3f} left")
    cap_name, cap, avail = min(caps, key=lambda c: c[2])
    return costguard.CapCheck(True, cap_name, cap, avail, f"{what}, fit under the {cap_name} cap "
                                                         f"({avail - need:.3f} GPU-h to spare)")


def _moves(ledger: Ledger, settings: Settings, exp_id: int, name: str, version: int, runs: Sequence[Run],
           latest: Mapping[str, Mapping[str, Any]], baseline: str, waves: Sequence[int], seeds: Sequence[int],
           k: int, step: WaveStep, *, actor: str) -> bool:
    """Bring the held runs in line with the latest look of each arm (look `k` the newest); True if
    anything moved."""
    held = [r for r in runs if r.state == HELD]
    if not held:
        return False
    moved = False
    stopped = {a for a, lk in latest.items() if lk["decision"] in ("crossed", "futile", "final")}
    for arm in sorted(stopped):
        keys = [r.run_key for r in held if r.arm == arm]
        if keys:
            why = f"sequential design: {latest[arm]['reason']}"
            step.cancelled += holds.cancel_held(ledger, settings, name, version, actor=actor, reason=why, run_keys=keys)
            moved = True
    refused = [lk for lk in latest.values() if lk["decision"] == "refused"]
    going = {a for a, lk in latest.items() if lk["decision"] == "continue"}
    left = [r for r in held if r.arm not in stopped]
    if refused and left:
        lk = refused[0]
        reason = lk["reason"].split("refused by the cost guard: ", 1)[-1]
        fields = {"estimated_gpu_hours": math.fsum(r.estimated_gpu_hours or 0.0 for r in left), "cap_gpu_hours": None,
                  "cost_basis": f"the held runs' estimates at enqueue; the next wave re-estimated at look {lk['look']}",
                  "cost_type": "estimated from ledger history at the look, not a measurement",
                  "available_budget": reason, "review_done": False, "automatic_retry": False,
                  "resolution": (f"not reproduced: high cost; wave {lk['look'] + 1} of {lk['looks']} refused at look "
                                 f"{lk['look']}, the seeds left are not run"), "reason": reason}
        _, keys = ledger.apply_decision(experiment_name=name, kind=KIND_NOT_REPRODUCED, actor=actor, fields=fields,
                                        experiment_id=exp_id, run_state="not_reproduced")
        step.not_reproduced += keys
        return True
    if not going:
        keys = [r.run_key for r in held if r.arm == baseline]
        if keys:
            why = f"sequential design: every arm stopped by look {k}; the baseline's later waves are not needed"
            step.cancelled += holds.cancel_held(ledger, settings, name, version, actor=actor, reason=why, run_keys=keys)
            moved = True
        return moved
    nxt = [r.run_key for r in held if r.arm in going | {baseline} and r.seed in seeds
           and wave_of(seeds, waves, r.seed) == k + 1]
    if nxt:
        out = holds.release(ledger, settings, name, version, actor=actor, run_keys=nxt,
                            reason=f"sequential design: wave {k + 1} of {len(waves)} released after look {k}")
        step.released += out.run_keys
        moved = True
    return moved
