"""The canary before a sweep on the control side: which runs an enqueue holds for it and which
canaries it starts (`gate`), the worker's job that submits one (as a run's: ledger row first, the
fence, the executor, the job id), booking its end (from the record its job wrote,
train/run/canary.py), and what that end does: passed -> the held runs of its shape released
(holds.release; runs a later wave of a sequential design holds stay held); failed -> they are
cancelled with the canary's reason (holds.cancel_held; notification `canary_failed`); an
infrastructure end (node failure, preemption, a lost job) -> queued again, MAX_INFRASTRUCTURE_RETRIES
times at most, never continued. `rerun` queues a failed canary again after a fix, its cancelled runs
back to held. One canary per shape and experiment version: a repeated enqueue reuses it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.settings import Settings, fault_pause
from ..contracts.accounting import gpu_hours
from ..contracts.allocation import attempt_folder
from ..contracts.canary_spec import (
    CANARY_PRIORITY,
    CANARY_RECORD_FILE,
    CANARY_RECORD_VERSION,
    CanarySpec,
    canary_specs,
    shape_of,
    shape_text,
    wanted,
)
from ..contracts.runspec import RunSpec
from ..contracts.states import (
    ATTEMPT_KIND_CANARY,
    CANARY_CANCEL_PREFIX,
    HELD,
    INFRASTRUCTURE_ATTEMPT_STATES,
    attempt_state_of,
)
from ..errors import LedgerError
from ..executor import JobInfo, make_executor
from ..ledger import Ledger
from ..ledger.schema import Attempt, Canary, Run
from . import holds, waves
from .costguard import Estimate
from .queue import CANARY_JOB_FUNC, RunQueue

log = logging.getLogger(__name__)

MAX_INFRASTRUCTURE_RETRIES = 2  # a canary's attempts ended by the infrastructure that are tried again


@dataclass
class Gate:
    """What an enqueue does for its canaries: the new runs it holds, and the canaries it starts."""

    held: set[str] = field(default_factory=set)
    new: list[CanarySpec] = field(default_factory=list)

    @property
    def gpu_hours(self) -> float:
        return sum(gpu_hours(c.gpus, c.minutes * 60.0) for c in self.new)


def _key(shape: Any) -> str:
    return json.dumps(dict(shape), sort_keys=True)


def gate(ledger: Ledger, spec: Any, runs: Sequence[RunSpec], todo: Sequence[RunSpec],
         experiment_id: int | None) -> Gate | None:
    """None when this enqueue gets no canary (`canary_spec.wanted` on all its `runs`); else the runs
    of `todo` to hold (those whose shape has no passed canary in this version) and the canaries to
    start (one per shape of `todo` the version has none for)."""
    if not wanted(spec.canary, spec.executor, runs):
        return None
    have = {_key(c.shape): c.state for c in ledger.canaries(experiment_id)} if experiment_id is not None else {}
    out = Gate(held={r.run_key for r in todo if have.get(_key(shape_of(r.train))) != "passed"})
    fresh = [r for r in todo if _key(shape_of(r.train)) not in have]
    out.new = canary_specs(fresh, gpus=spec.canary_gpus, minutes=spec.canary_minutes)
    return out


def with_canaries(est: Estimate, g: Gate | None) -> Estimate:
    """The enqueue's estimate with its canaries' allocations (gpus x minutes) added: what the caps check."""
    if g is None or not g.new:
        return est
    return replace(est, total_gpu_hours=est.total_gpu_hours + g.gpu_hours,
                   cost_basis=f"{est.cost_basis}; + {len(g.new)} canary allocation(s), {g.gpu_hours:.3f} GPU-h "
                              f"at their time limit")


def start(ledger: Ledger, settings: Settings, experiment_id: int, specs: Sequence[CanarySpec], *, actor: str,
          queue_name: str) -> list[str]:
    """Record the canaries (the ledger first), then put their jobs on the queue."""
    keys = ledger.create_canaries(experiment_id, specs, actor=actor)
    if keys:
        RunQueue.from_url(settings.redis_url, queue_name).enqueue_by_priority(((k, CANARY_PRIORITY) for k in keys),
                                                                              func=CANARY_JOB_FUNC)
    return keys


# -- the worker's job ---------------------------------------------------------------------------


def submit_canary(ledger: Ledger, settings: Settings, key: str, *, worker: str) -> dict[str, Any]:
    """Submit the canary `key`, unless the ledger says it is not ours to submit."""
    try:
        spec = CanarySpec.from_dict(ledger.canary(key).spec)
        c, att = ledger.begin_canary(key, actor=settings.user, worker=worker, executor=spec.executor, gpus=spec.gpus)
    except LedgerError as exc:
        log.info("canary %s not submitted: %s", key, exc.message)
        return {"canary": key, "skipped": exc.message}
    if att is None:
        return {"canary": key, "skipped": c.state}
    folder = attempt_folder(settings.jobs_dir, spec.run_key, att.number)
    inline = settings.inline_queue
    executor = make_executor(spec.executor, jobs_dir=settings.jobs_dir, profile=spec.profile,
                             redis_url=None if inline else settings.redis_url)
    fault_pause(settings, "before_submit")
    if ledger.attempt_state(spec.run_key, att.number) != "submitting":  # the fence: see worker.submit_run
        return {"canary": key, "skipped": "attempt settled by reconcile before sbatch"}
    try:
        job_id = executor.submit(spec, att.number, folder, lookup=False)
    except Exception as exc:  # noqa: BLE001 (any refusal is booked)
        reason = f"submission refused: {type(exc).__name__}: {exc}"[:2000]
        _conclude(ledger, settings, ledger.end_canary(key, att.number, attempt_state="failed", canary_state="failed",
                                                      reason=reason, record=None, actor=settings.user),
                  actor=settings.user)
        return {"canary": key, "failed": reason}
    if spec.executor == "debug" or inline:
        state = settle(ledger, settings, key, att, executor.wait_final(job_id), folder, actor=settings.user,
                       job_id=job_id)
        return {"canary": key, "attempt": att.number, "job_id": job_id, "state": state}
    ledger.mark_canary_submitted(key, att.number, job_id=job_id, actor=settings.user)
    return {"canary": key, "attempt": att.number, "job_id": job_id, "executor": spec.executor}


# -- its end --------------------------------------------------------------------------------------


def read_record(folder: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) when the job left a canary record for `key` in `folder`; (None, why) otherwise."""
    try:
        rec = json.loads((Path(folder) / CANARY_RECORD_FILE).read_text())
    except FileNotFoundError:
        return None, "the canary job ended without writing its record"
    except (OSError, ValueError) as exc:
        return None, f"canary record unreadable: {exc}"
    if not isinstance(rec, dict) or rec.get("canary_record") != CANARY_RECORD_VERSION or rec.get("key") != key:
        return None, f"canary record invalid (version or key is not {CANARY_RECORD_VERSION} / {key})"
    if not isinstance(rec.get("checks"), list) or not isinstance(rec.get("passed"), bool):
        return None, "canary record invalid (no checks or no passed)"
    return rec, None


def settle(ledger: Ledger, settings: Settings, key: str, att: Attempt, info: JobInfo, folder: Path, *, actor: str,
           job_id: str | None = None) -> str:
    """Book an ended canary attempt and do what its end means for the held runs; returns the canary's
    new state."""
    rec, problem = read_record(folder, key)
    scheduler = attempt_state_of(info.state)
    elapsed = info.elapsed_seconds
    figures = {"started_at": info.start, "ended_at": info.end, "elapsed_seconds": elapsed,
               "gpu_hours_job": gpu_hours(att.gpus, elapsed) if elapsed is not None else None,
               "gpu_hours_scheduler": info.gpu_hours, "scheduler_state": info.state, "exit_code": info.exit_code}
    if rec is not None:
        state, attempt_state = ("passed", "succeeded") if rec["passed"] else ("failed", "failed")
        reason = None if rec["passed"] else f"{rec.get('reason') or 'a check failed'}"
    elif scheduler in INFRASTRUCTURE_ATTEMPT_STATES or scheduler == "node_fail":
        tries = sum(1 for a in ledger.get_run(_run_key(ledger, key)).attempts if a.kind == ATTEMPT_KIND_CANARY)
        attempt_state, reason = scheduler, f"{info.state}: an infrastructure end ({problem})"
        state = "queued" if tries <= MAX_INFRASTRUCTURE_RETRIES else "lost"
    else:
        attempt_state, state = scheduler if scheduler != "succeeded" else "failed", "failed"
        reason = f"{info.state}" + (f" (exit {info.exit_code})" if info.exit_code else "") + f": {problem}"
    c = ledger.end_canary(key, att.number, attempt_state=attempt_state, canary_state=state, reason=reason,
                          record=rec, actor=actor, job_id=job_id, **figures)
    _conclude(ledger, settings, c, actor=actor)
    return c.state


def _run_key(ledger: Ledger, key: str) -> str:
    return CanarySpec.from_dict(ledger.canary(key).spec).run_key


def _conclude(ledger: Ledger, settings: Settings, c: Canary, *, actor: str) -> None:
    """What a canary's new state does: passed -> release its shape's held runs (but a later wave's);
    failed or lost -> cancel them with its reason; queued (an infrastructure end) -> back on the queue."""
    spec = CanarySpec.from_dict(c.spec)
    exp = c.run.experiment
    if c.state == "queued":
        if not settings.inline_queue:
            RunQueue.from_url(settings.redis_url, settings.queue_for(exp.queue)).defer(
                c.key, 1, generation=int(time.time() * 1000), priority=CANARY_PRIORITY, func=CANARY_JOB_FUNC)
        return
    mine = [r for r in ledger.runs(experiment_id=exp.id, states=[HELD], with_attempts=False)
            if _key(shape_of(r.run_spec.get("train") or {})) == _key(c.shape)]
    if c.state == "passed":
        later = _later_waves(ledger, exp.id, mine)
        keys = [r.run_key for r in mine if r.run_key not in later]
        if keys:
            holds.release(ledger, settings, exp.name, exp.version, actor=actor, run_keys=keys,
                          reason=f"canary {c.key} passed ({shape_text(spec.shape)})")
        return
    if c.state in ("failed", "lost"):
        why = f"{CANARY_CANCEL_PREFIX}{c.reason or c.state} (canary {c.key}; `ggpo-batch canary {exp.name}@{exp.version} --rerun` after a fix)"
        holds.cancel_held(ledger, settings, exp.name, exp.version, actor=actor, reason=why[:2000],
                          run_keys=[r.run_key for r in mine])


def _later_waves(ledger: Ledger, experiment_id: int, runs: Sequence[Run]) -> set[str]:
    """Of `runs`, those a sequential design holds for a later wave than the one it has reached."""
    spec = ledger.experiment_spec(experiment_id)
    s = waves.design(spec)
    if s is None:
        return set()
    seeds, ws = list(spec.get("seeds") or ()), list(s["waves"])
    reached = max((lk["look"] for lk in ledger.looks(experiment_id) if lk["decision"] == "continue"), default=0) + 1
    return {r.run_key for r in runs if r.seed in seeds and waves.wave_of(seeds, ws, r.seed) > reached}


def reconcile_attempt(ledger: Ledger, settings: Settings, run: Run, att: Attempt, info: JobInfo, *,
                      actor: str) -> tuple[int, int]:
    """A canary's live attempt against its scheduler: booked if ended, marked running if it started."""
    from ..reporting.joblogs import job_folder

    key = ledger.canary_of_run(run.id).key
    if info.final:
        settle(ledger, settings, key, att, info, job_folder(settings.jobs_dir, run, att), actor=actor)
        return 1, 0
    if info.state == "RUNNING" and att.state == "submitted":
        ledger.mark_canary_running(key, att.number, actor=actor, started_at=info.start)
        return 0, 1
    return 0, 0


def resolve_submitting(ledger: Ledger, settings: Settings, ex: Any, run: Run, att: Attempt, *, actor: str) -> int:
    """A canary attempt left `submitting` by a worker that died (stale; the caller checked): found by
    its job's name (submitted), or never submitted (lost: an infrastructure end, queued again)."""
    c = ledger.canary_of_run(run.id)
    spec = CanarySpec.from_dict(c.spec)
    job_id = ex.find(spec.run, att.number, attempt_folder(settings.jobs_dir, run.run_key, att.number))
    if job_id is not None:
        ledger.mark_canary_submitted(c.key, att.number, job_id=job_id, actor=actor)
        return 1
    info = JobInfo(job_id="", state="LOST", exit_code="worker died while submitting; the scheduler never got it")
    settle(ledger, settings, c.key, att, info, attempt_folder(settings.jobs_dir, run.run_key, att.number), actor=actor)
    return 1


# -- reading and re-running ------------------------------------------------------------------------


def _experiment(ledger: Ledger, name: str, version: int | None) -> Any:
    versions = ledger.experiments(name)
    exp = versions[-1] if versions and version is None else next((e for e in versions if e.version == version), None)
    if exp is None:
        raise LedgerError(f"no experiment {name!r}" + (f" version {version}" if version is not None else ""))
    return exp


def view(ledger: Ledger, name: str, version: int | None = None) -> dict[str, Any]:
    """The canaries of an experiment version (reporting/canary_view.py), for `ggpo-batch canary`."""
    from ..reporting.canary_view import canary_rows

    exp = _experiment(ledger, name, version)
    return {"experiment": exp.name, "version": exp.version, "canaries": canary_rows(ledger, exp.id)}


def rerun(ledger: Ledger, settings: Settings, name: str, version: int | None = None, *,
          actor: str) -> list[str]:
    """Queue the failed (or lost) canaries of a version again after a fix: the runs they cancelled go
    back to held first, and are released when the canary passes. Returns the canary keys queued."""
    exp = _experiment(ledger, name, version)
    todo = [c for c in ledger.canaries(exp.id) if c.state in ("failed", "lost")]
    if not todo:
        raise LedgerError(f"{exp.name} v{exp.version} has no failed canary to re-run")
    runs = ledger.runs(experiment_id=exp.id, states=["cancelled"], with_attempts=False)
    for c in todo:
        mine = [r.run_key for r in runs if _key(shape_of(r.run_spec.get("train") or {})) == _key(c.shape)]
        ledger.rehold_cancelled(exp.id, mine, actor=actor, reason=f"canary {c.key} re-run by {actor}")
        ledger.requeue_canary(c.key, actor=actor, reason=f"re-run by {actor}")
    keys = [c.key for c in todo]
    RunQueue.from_url(settings.redis_url, settings.queue_for(exp.queue)).enqueue_by_priority(
        ((k, CANARY_PRIORITY) for k in keys), func=CANARY_JOB_FUNC)
    return keys
