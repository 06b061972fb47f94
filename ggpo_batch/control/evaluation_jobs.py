"""An evaluation after training on the worker's side and reconcile's: submitting its attempt (as
worker.submit_run submits a run's: ledger row first, the quota, the fence, the executor, the job id),
booking its end (state, both GPU-hour figures, the outcome set and the record, from the evaluation
record the job wrote), and reconcile's share (ended and started jobs, a worker that died while
submitting; queued evaluations Redis lost are reconcile.py's own). Never retried but by hand: an infrastructure failure
ends it failed or lost, with the cause.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..config.settings import Settings, fault_pause
from ..contracts.accounting import gpu_hours
from ..contracts.allocation import attempt_folder, evaluation_record_path
from ..contracts.evaluation_spec import EVALUATION_RECORD_VERSION, EvaluationSpec
from ..contracts.outcome import outcome_from_evaluation
from ..contracts.states import RUN_STATE_AFTER, attempt_state_of
from ..errors import LedgerError
from ..executor import Executor, JobInfo, make_executor
from ..ledger import Ledger, QuotaExceeded
from ..ledger.schema import Attempt, Evaluation, Run, utcnow
from ..ledger.submissions import AttemptPlan
from . import progress
from .queue import EVALUATION_JOB_FUNC, RunQueue

log = logging.getLogger(__name__)


def submit_evaluation(ledger: Ledger, settings: Settings, key: str, *, worker: str) -> dict[str, Any]:
    """Submit the next attempt of the evaluation `key`, unless the ledger says it is not ours to submit."""
    inline = settings.inline_queue
    chosen: dict[str, Any] = {}

    def plan(spec_dict: dict[str, Any], experiment_queue: str | None) -> AttemptPlan:
        spec = EvaluationSpec.from_dict(spec_dict)
        queue_name = settings.queue_for(experiment_queue)
        quota = (queue_name, settings.queue_gpu_quota) if settings.queue_gpu_quota and not inline else None
        chosen.update(spec=spec, queue=queue_name)
        return AttemptPlan(spec.executor, spec.gpus, quota)

    try:
        ev, att = ledger.begin_evaluation(key, actor=settings.user, worker=worker, plan=plan)
    except QuotaExceeded as exc:  # still queued in the ledger; back on Redis later
        RunQueue.from_url(settings.redis_url, chosen["queue"]).defer(key, settings.defer_seconds,
                                                                     generation=int(time.time() * 1000),
                                                                     func=EVALUATION_JOB_FUNC)
        return {"evaluation": key, "deferred": exc.message}
    except LedgerError as exc:
        log.info("evaluation %s not submitted: %s", key, exc.message)
        return {"evaluation": key, "skipped": exc.message}
    if att is None:
        log.info("evaluation %s is %s: nothing to submit", key, ev.state)
        return {"evaluation": key, "skipped": ev.state}
    spec: EvaluationSpec = chosen["spec"]
    folder = attempt_folder(settings.jobs_dir, spec.run_key, att.number)
    shown = progress.current()
    if shown is not None:
        shown.note(f"{key} attempt {att.number}")
    executor = make_executor(spec.executor, jobs_dir=settings.jobs_dir, profile=spec.profile,
                             redis_url=None if inline else settings.redis_url)
    fault_pause(settings, "before_submit")
    if ledger.attempt_state(spec.run_key, att.number) != "submitting":  # the fence: see worker.submit_run
        log.error("evaluation %s attempt %d was settled while this job waited: not submitting", key, att.number)
        return {"evaluation": key, "skipped": "attempt settled by reconcile before sbatch"}
    try:
        job_id = executor.submit(spec, att.number, folder, lookup=False)
    except Exception as exc:  # noqa: BLE001 (any refusal is booked, as worker.submit_run books it)
        reason = f"submission refused: {type(exc).__name__}: {exc}"[:2000]
        ledger.resolve_evaluation_submitting(key, att.number, job_id=None, actor=settings.user, reason=reason,
                                             state="failed")
        log.error("evaluation %s: %s", key, reason)
        return {"evaluation": key, "failed": reason}
    ended = spec.executor == "debug"  # ended inside submit(): submission and end in one transaction
    state = None
    try:
        if ended:
            state = settle_evaluation(ledger, key, att, executor.wait_final(job_id), folder, actor=settings.user,
                                      job_id=job_id)
        else:
            ledger.mark_evaluation_submitted(key, att.number, job_id=job_id, actor=settings.user)
    except LedgerError as exc:
        log.error("evaluation %s: %s; cancelling job %s, which the ledger does not know", key, exc.message, job_id)
        executor.cancel(job_id)
        return {"evaluation": key, "cancelled_unbooked": job_id, "reason": exc.message}
    if inline and not ended:
        state = settle_evaluation(ledger, key, att, executor.wait_final(job_id), folder, actor=settings.user)
    out: dict[str, Any] = {"evaluation": key, "attempt": att.number, "job_id": job_id, "executor": spec.executor}
    if state is not None:
        out["state"] = state
    return out


# -- booking its end -------------------------------------------------------------------------------


def check_evaluation_record(rec: Any, spec: EvaluationSpec, trained: set[str] | None,
                            policy_sha256: str | None = None) -> list[str]:
    """What is wrong with an evaluation record for `spec` (train/eval_job.py's table): its version,
    run and set, the data it scored (sha256, every item once), the policy it loaded (against the
    training's export, `policy_sha256`; None: not checked), and each item's exposure against the
    run's trained items (`trained`, None: not checked)."""
    if not isinstance(rec, Mapping):
        return ["not a JSON object"]
    problems = []
    if policy_sha256 is not None and rec.get("policy_sha256") != policy_sha256:
        problems.append("it scored another policy than the run exported (policy_sha256 differs)")
    if rec.get("evaluation_record") != EVALUATION_RECORD_VERSION:
        problems.append(f"evaluation_record {rec.get('evaluation_record')!r}, expected {EVALUATION_RECORD_VERSION}")
    if (rec.get("run_key"), rec.get("name")) != (spec.run_key, spec.name):
        problems.append(f"it is {rec.get('run_key')}/{rec.get('name')}, not {spec.run_key}/{spec.name}")
    if (rec.get("data") or {}).get("sha256") != spec.data_sha256:
        problems.append("it scored another data file (sha256 differs)")
    rows = (rec.get("evaluation") or {}).get("per_item")
    if not isinstance(rows, list) or not all(isinstance(r, Mapping) for r in rows):
        return [*problems, "no per_item rows"]
    ids = [r.get("item_id") for r in rows]
    if len(ids) != spec.items or len(set(ids)) != len(ids):
        problems.append(f"{len(ids)} rows for {len(set(ids))} distinct items; the data file has {spec.items}")
    if trained is not None:
        wrong = [r.get("item_id") for r in rows if bool(r.get("exposed")) != (r.get("item_id") in trained)]
        if wrong:
            problems.append(f"{len(wrong)} item(s) with an exposure that disagrees with the run's trained items "
                            f"({wrong[0]!r}, ...)")
    elapsed = (rec.get("timing") or {}).get("elapsed_seconds")
    if isinstance(elapsed, bool) or not isinstance(elapsed, (int, float)) or not 0 <= elapsed < 1e9:
        problems.append("timing.elapsed_seconds is not a number of seconds")
    return problems


def _training(details: str) -> tuple[set[str] | None, str | None]:
    """(trained item ids, policy sha256) from the run's training details (None where absent)."""
    try:
        data = json.loads(Path(details).read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    ids, sha = data.get("trained_item_ids"), data.get("policy_sha256")
    return ({str(i) for i in ids} if isinstance(ids, list) else None), (sha if isinstance(sha, str) else None)


def read_evaluation_record(folder: Path, spec: EvaluationSpec) -> tuple[dict[str, Any] | None, str | None]:
    """(record, None) when the job left a valid one in `folder`; (None, why) otherwise."""
    path = evaluation_record_path(folder)
    try:
        rec = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "the job ended without writing its evaluation record"
    except (OSError, ValueError) as exc:
        return None, f"evaluation record unreadable: {exc}"
    problems = check_evaluation_record(rec, spec, *_training(spec.details_path))
    if problems:
        return None, "evaluation record invalid: " + "; ".join(problems[:3])
    return rec, None


def conclude(ev: Evaluation, att: Attempt, info: JobInfo, folder: Path) -> dict[str, Any]:
    """The `finish_evaluation` fields an attempt's end implies (reads the job's files, writes nothing)."""
    spec = EvaluationSpec.from_dict(ev.spec)
    state = attempt_state_of(info.state)
    reason = None if info.state == "COMPLETED" else f"{info.state}" + (f" (exit {info.exit_code})"
                                                                         if info.exit_code else "")
    outcome = record = None
    elapsed = info.elapsed_seconds
    job_gh = gpu_hours(att.gpus, elapsed) if elapsed is not None else None
    if state == "succeeded":
        rec, problem = read_evaluation_record(folder, spec)
        outcome = outcome_from_evaluation(rec["evaluation"]) if rec is not None else None
        if rec is None or outcome is None:
            state, reason = "failed", problem or "the evaluation record has no usable outcome"
        else:
            own = float(rec["timing"]["elapsed_seconds"])
            job_gh = gpu_hours(att.gpus, own)
            elapsed = elapsed if elapsed is not None else own
            record = {**rec, "evaluation": {k: v for k, v in rec["evaluation"].items() if k != "per_item"}}
    return {"attempt_state": state, "evaluation_state": None if ev.state == "cancelled" else RUN_STATE_AFTER[state],
            "reason": reason, "started_at": info.start, "ended_at": info.end, "elapsed_seconds": elapsed,
            "gpu_hours_job": job_gh, "gpu_hours_scheduler": info.gpu_hours, "scheduler_state": info.state,
            "exit_code": info.exit_code, "outcome": outcome, "record": record}


def settle_evaluation(ledger: Ledger, key: str, att: Attempt, info: JobInfo, folder: Path, *, actor: str,
                      job_id: str | None = None) -> str:
    """Book the end of an evaluation's attempt (with `job_id`: its submission too); returns the
    attempt's final state."""
    ev = ledger.get_evaluation(key)
    fields = conclude(ev, att, info, folder)
    ledger.finish_evaluation(key, att.number, actor=actor, job_id=job_id, **fields)
    log.info("evaluation %s attempt %d: %s -> %s", key, att.number, info.state, fields["evaluation_state"])
    return str(fields["attempt_state"])


# -- reconcile's share -----------------------------------------------------------------------------


def _key_of(ledger: Ledger, att: Attempt) -> str:
    return ledger.evaluation_key_of(att.evaluation_id)  # type: ignore[arg-type]


def reconcile_attempt(ledger: Ledger, settings: Settings, run: Run, att: Attempt, info: JobInfo, *,
                      actor: str) -> tuple[int, int]:
    """An evaluation's live attempt against what its scheduler says: booked if ended, marked running
    if it started. Returns (ended, started)."""
    key = _key_of(ledger, att)
    if info.final:
        from ..reporting.joblogs import job_folder

        settle_evaluation(ledger, key, att, info, job_folder(settings.jobs_dir, run, att), actor=actor)
        return 1, 0
    if info.state == "RUNNING" and att.state == "submitted":
        ledger.mark_evaluation_running(key, att.number, actor=actor, started_at=info.start)
        return 0, 1
    return 0, 0


def resolve_submitting(ledger: Ledger, settings: Settings, ex: Executor, run: Run, att: Attempt, *,
                       busy: Mapping[str, str | None], stale_after: timedelta, actor: str) -> int:
    """An evaluation's attempt left `submitting` by a worker that died: found by its job's name
    (submitted) or not (lost; no retry but by hand). Returns 1 when it was resolved."""
    key = _key_of(ledger, att)
    if key in busy or utcnow() - att.created_at < stale_after:
        return 0  # its worker may still be submitting it
    spec = EvaluationSpec.from_dict(ledger.get_evaluation(key).spec)
    job_id = ex.find(spec.run, att.number, attempt_folder(settings.jobs_dir, run.run_key, att.number))
    ledger.resolve_evaluation_submitting(key, att.number, job_id=job_id, actor=actor,
                                         reason="worker died while submitting; " + (
                                             f"the scheduler has job {job_id}" if job_id else
                                             "the scheduler never got it"))
    return 1
