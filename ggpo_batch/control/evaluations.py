"""Evaluations after training: scoring every succeeded run's exported policy again, on a new data
file, as the outcome set NAME -- without paying for training again.

`evaluate_experiment` (`ggpo-batch evaluate`) and settlement (a spec's `[[evaluations]]`, queued in
the transaction that books a run's success) add evaluation rows to the ledger, queued; the RQ jobs
follow (`enqueue_evaluations`), and reconcile puts back any a Redis flush lost, as it does runs.
A worker submits each through the run's executor as one attempt of kind `evaluation`
(evaluation_jobs.py); its GPU-hours are booked on that attempt. The run stays succeeded.

What an evaluation needs of its run, read from the training attempt's details file (train/job.py):
the exported policy (`policy_dir`) and the ids of every item the run trained on
(`trained_item_ids`): an item trained on is exposed in any set. A run without them (imported, or
trained before this existed) is left out, with the reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..config.settings import Settings
from ..contracts.allocation import details_path
from ..contracts.evaluation_spec import EvaluationRequest, EvaluationSpec, evaluation_key, name_problem, requests_of
from ..contracts.states import TRAINING_ATTEMPT_KINDS, UNFINISHED_EVALUATION_STATES
from ..errors import LedgerError, SpecError
from ..ledger import Ledger
from ..ledger.new_evaluations import NewEvaluation
from ..ledger.schema import Attempt, Evaluation, Experiment, Run
from ..reporting.joblogs import job_folder
from ..spec.evaluation_requests import check_data, check_gpus
from .queue import EVALUATION_JOB_FUNC, RunQueue

log = logging.getLogger(__name__)

SOURCE_COMMAND, SOURCE_SPEC = "command", "spec"


def training_sources(jobs_dir: Path, run: Run) -> tuple[str, str] | str:
    """(policy_dir, details path) of the run's succeeded training attempt, or why it has none usable."""
    done = [a for a in run.attempts if a.state == "succeeded" and a.kind in TRAINING_ATTEMPT_KINDS]
    if run.state != "succeeded" or not done:
        return f"is {run.state}, with no succeeded training attempt"
    if done[-1].executor == "import":
        return "was imported from a results file: it has no exported policy"
    return sources_in(job_folder(jobs_dir, run, done[-1]))


def sources_in(folder: Path) -> tuple[str, str] | str:
    """(policy_dir, details path) a training job left in its attempt `folder`, or what is missing."""
    details = details_path(folder)
    try:
        data = json.loads(details.read_text())
    except (OSError, ValueError) as exc:
        return f"its details file {details} cannot be read ({exc.__class__.__name__})"
    policy = data.get("policy_dir") if isinstance(data, dict) else None
    if not isinstance(policy, str) or not Path(policy).is_dir():
        return f"its exported policy ({policy or 'none in ' + str(details)}) is not on this machine"
    if not isinstance(data.get("trained_item_ids"), list):
        return f"{details} has no trained_item_ids (trained before evaluations existed): exposure unknown"
    return policy, str(details)


def _spec(run: Run, request: EvaluationRequest, sha256: str, items: int, policy: str, details: str) -> EvaluationSpec:
    return EvaluationSpec(key=evaluation_key(run.run_key, request.name), name=request.name, run_key=run.run_key,
                          data_path=request.data, data_sha256=sha256, items=items, gpus=request.gpus, policy_dir=policy,
                          details_path=details, run_spec=dict(run.run_spec))


@dataclass
class EvaluateResult:
    """What `evaluate` did: the evaluations it added (and queued), the runs it left out and why."""

    experiment: str
    version: int
    name: str
    data: str
    data_sha256: str
    items: int
    gpus: int
    queue: str
    added: list[Evaluation] = field(default_factory=list)
    existing: list[Evaluation] = field(default_factory=list)  # already in the ledger (same data)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (run key, why)
    enqueued: int = 0


def _experiment(ledger: Ledger, name: str, version: int | None) -> Experiment:
    versions = ledger.experiments(name)
    if not versions:
        raise LedgerError(f"no experiment {name!r} in the ledger")
    exp = versions[-1] if version is None else next((e for e in versions if e.version == version), None)
    if exp is None:
        raise LedgerError(f"experiment {name!r} has no version {version} "
                          f"(versions: {', '.join(str(e.version) for e in versions)})")
    return exp


def evaluate_experiment(ledger: Ledger, settings: Settings, experiment: str, *, data: str, name: str, gpus: int = 1,
                        version: int | None = None, actor: str) -> EvaluateResult:
    """Queue one evaluation per succeeded run of `experiment` (its latest version, or `version`) on the
    items of `data`, as the outcome set `name`. The data file is checked first (SpecError, exit 2:
    nothing queued); then the ledger, then Redis. Run again, it adds only what is missing."""
    problem = name_problem(name)
    if problem:
        raise SpecError("evaluate", "--name", problem)
    try:  # the data file is read as the experiment's task reads its items ([train.task], [train.data.columns])
        train = ledger.experiment_spec(_experiment(ledger, experiment, version).id).get("train")
    except LedgerError:
        train = None  # the data file's problem first; the ledger's below
    path, sha, items = check_data(data, train=train if isinstance(train, dict) else None)
    exp = _experiment(ledger, experiment, version)
    queue = settings.queue_for(exp.queue)
    res = EvaluateResult(exp.name, exp.version, name, path, sha, items, gpus, queue)
    runs = ledger.runs(experiment_id=exp.id, states=["succeeded"])
    have = {e.run_id: e for e in ledger.evaluations(experiment_id=exp.id, name=name)}
    request = EvaluationRequest(name, path, gpus)
    new: list[NewEvaluation] = []
    checked: set[str] = set()
    for run in runs:
        if run.id in have:
            other = have[run.id]
            if other.spec.get("data_sha256") != sha:
                raise SpecError(path, "--name", f"{exp.name} v{exp.version} already has outcome set {name!r} from "
                                f"{other.spec.get('data_path')} (other content): choose another name")
            res.existing.append(other)
            continue
        if exp.source != "spec":
            res.skipped.append((run.run_key, "was imported from a results file: it has no exported policy"))
            continue
        found = training_sources(settings.jobs_dir, run)
        if isinstance(found, str):
            res.skipped.append((run.run_key, found))
            continue
        shape = json.dumps([run.run_spec.get(k) for k in ("executor", "profile", "train")], sort_keys=True)
        if shape not in checked:
            check_gpus(run.run_spec, gpus, "evaluate", "--gpus")
            checked.add(shape)
        spec = _spec(run, request, sha, items, *found)
        new.append(NewEvaluation(run.id, spec.key, name, SOURCE_COMMAND, spec.to_dict(), gpus))
    added = set(ledger.add_evaluations(new, actor=actor))
    res.added = [e for e in ledger.evaluations(experiment_id=exp.id, name=name) if e.key in added]
    res.enqueued = enqueue_evaluations(settings, queue, [e.key for e in res.added])
    log.info("evaluate %s v%d as %r: %d queued, %d already there, %d left out", exp.name, exp.version, name,
             len(res.added), len(res.existing), len(res.skipped))
    return res


def enqueue_evaluations(settings: Settings, queue: str, keys: Sequence[str]) -> int:
    """One RQ job per evaluation key on `queue` (the ledger has them queued already)."""
    if not keys:
        return 0
    return RunQueue.from_url(settings.redis_url, queue).enqueue(list(keys), func=EVALUATION_JOB_FUNC)


def planned_by_spec(run_spec: dict[str, Any] | None, run_key: str, folder: Path) -> list[NewEvaluation]:
    """The `[[evaluations]]` of a run's spec as rows for the transaction that books its success (the
    training attempt in `folder`): queued, or failed with the cause when its data file or the
    training's exports are not usable (`retry --evaluation` once mended). `run_id` is 0 here:
    settlement fills it in (`for_run`)."""
    requests = requests_of(run_spec or {})
    if not requests:
        return []
    found = sources_in(folder)
    out = []
    for r in requests:
        spec = EvaluationSpec(key=evaluation_key(run_key, r.name), name=r.name, run_key=run_key, data_path=r.data,
                              data_sha256="", items=0, gpus=r.gpus, policy_dir="", details_path="",
                              run_spec=dict(run_spec or {}))
        cause = found if isinstance(found, str) else None
        if cause is None:
            try:
                _path, sha, items = check_data(r.data, "settlement", f"evaluations.{r.name}.data",
                                                  (run_spec or {}).get("train"))
                spec = replace(spec, data_sha256=sha, items=items, policy_dir=found[0], details_path=found[1])
            except SpecError as exc:
                cause = exc.message
        out.append(NewEvaluation(0, spec.key, r.name, SOURCE_SPEC, spec.to_dict(), r.gpus,
                                 state="failed" if cause else "queued", cause=cause))
    return out


def for_run(planned: Sequence[NewEvaluation], run_id: int) -> list[NewEvaluation]:
    return [replace(n, run_id=run_id) for n in planned]


# -- cancel and retry, by hand -------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluationCancel:
    run_key: str
    evaluation: str
    was: str
    removed_jobs: int
    cancelled_job: str | None


def _live_attempt(run: Run, ev: Evaluation) -> Attempt | None:
    live = [a for a in run.attempts if a.evaluation_id == ev.id and a.job_id and a.state in ("submitted", "running")]
    return live[-1] if live else None


def cancel_evaluations(ledger: Ledger, settings: Settings, keys: Sequence[str], *, actor: str,
                       reason: str | None = None) -> list[EvaluationCancel]:
    """Cancel unfinished evaluations: their waiting RQ jobs removed, their allocations cancelled; the
    next reconcile books the cancelled attempt's GPU-hours."""
    from ..executor import make_executor

    out = []
    for key in keys:
        ev = ledger.get_evaluation(key)
        if ev.state not in UNFINISHED_EVALUATION_STATES:
            continue
        run = ledger.get_run(ev.run.run_key)
        removed = RunQueue.from_url(settings.redis_url, settings.queue_for(run.experiment.queue)).remove(key)
        job = None
        att = _live_attempt(run, ev)
        if att is not None:
            profile = str(run.run_spec.get("profile", "default"))
            make_executor(att.executor, jobs_dir=settings.jobs_dir, profile=profile).cancel(str(att.job_id))
            job = att.job_id
        ledger.cancel_evaluation(key, actor=actor, reason=reason or f"cancelled by {actor}")
        out.append(EvaluationCancel(run.run_key, ev.name, ev.state, removed, job))
        log.info("cancelled evaluation %s (was %s, job %s)", key, ev.state, job)
    return out


def retry_evaluation(ledger: Ledger, settings: Settings, key: str, *, actor: str, reason: str) -> Evaluation:
    """Queue an evaluation that ended without success again, by hand, with the reason recorded. Its
    data file and the run's exports are checked again first (one that failed as settlement queued
    it gets them now); a data file whose content changed is refused: the set would mix two files."""
    ev = ledger.get_evaluation(key)
    found = training_sources(settings.jobs_dir, ledger.get_run(ev.run.run_key))
    if isinstance(found, str):
        raise LedgerError(f"evaluation {key}: its run {found}")
    path, sha, items = check_data(str(ev.spec.get("data_path")), "retry", "--evaluation")
    if ev.spec.get("data_sha256") and ev.spec["data_sha256"] != sha:
        raise SpecError("retry", "--evaluation", f"{path} changed since outcome set {ev.name!r} was queued (sha256 "
                        f"differs): evaluate it under a new name")
    spec = {**ev.spec, "data_sha256": sha, "items": items, "policy_dir": found[0], "details_path": found[1]}
    ev = ledger.requeue_evaluation(key, actor=actor, reason=f"manual retry: {reason.strip()}", spec=spec)
    queue = RunQueue.from_url(settings.redis_url, settings.queue_for(ev.run.experiment.queue))
    queue.forget([key])
    queue.enqueue([key], func=EVALUATION_JOB_FUNC)
    return ev


def evaluation_keys(ledger: Ledger, *, run_key: str | None, experiment: str | None, name: str) -> list[str]:
    """The keys of outcome set `name`'s evaluations of one run, or of every version of an experiment."""
    if run_key is not None:
        return [evaluation_key(run_key, name)]
    return [e.key for exp in ledger.experiments(experiment) for e in ledger.evaluations(experiment_id=exp.id,
                                                                                         name=name)]
