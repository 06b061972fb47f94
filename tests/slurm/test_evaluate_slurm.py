"""`evaluate` through the dev Slurm: a run trained there, then its evaluation after training as a
1-GPU allocation of its own (AllocTRES gres/gpu=1), booked on an attempt of kind `evaluation` with
Slurm's GPU-hours beside the job's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.executor.sacct import Sacct
from ggpo_batch.spec.parse import load_spec
from tests.support.slurm import sacct_gpu_hours

pytestmark = [pytest.mark.slurm, pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
gpus = 4
loop_budget_seconds = 1
executor = "slurm"
profile = "dev-cluster-1task"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[train]
eval_size = 2
[arms.clean]
exposure = "none"
"""


def test_evaluate_takes_a_one_gpu_slurm_allocation_and_books_its_gpu_hours(  # type: ignore[no-untyped-def]
        dev_cluster, ledger, settings, worker_env, tmp_path: Path, tag: str) -> None:
    from ggpo_batch.control.evaluations import evaluate_experiment
    from ggpo_batch.control.worker import run_worker
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.task.qa import synthetic

    name = f"ev-{tag}"
    (tmp_path / "ev.toml").write_text(SPEC.format(name=name))
    enqueue_spec(ledger, settings, load_spec(tmp_path / "ev.toml"), actor="tester")
    run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=300)
    key = f"{name}-v1-1-clean"
    assert ledger.get_run(key).state == "succeeded", ledger.get_run(key).cause
    data = synthetic(TrainConfig.from_table({}, "<test>"))
    items = tmp_path / "eval2.jsonl"
    items.write_text("".join(json.dumps({"id": i.item_id, "question": i.question, "answers": list(i.answers),
                                         "support_titles": list(i.support_titles)}) + "\n"
                             for i in [*data.train[:2], *data.heldout[:2]]))
    res = evaluate_experiment(ledger, settings, name, data=str(items), name="eval2", gpus=1, actor="tester")
    assert res.enqueued == 1
    run_worker(settings, [settings.queue], burst=True, reconcile_interval=5, settle_timeout=300)
    run = ledger.get_run(key)
    training, evaluation = run.attempts
    assert run.state == "succeeded" and (training.kind, evaluation.kind) == ("training", "evaluation")
    assert (evaluation.state, evaluation.executor, evaluation.gpus) == ("succeeded", "slurm", 1), evaluation.reason
    assert evaluation.job_id and evaluation.job_id != training.job_id
    assert Sacct().accounts([evaluation.job_id])[evaluation.job_id].latest.alloc_gpus == 1  # its own 1-GPU allocation
    assert [evaluation.gpu_hours_scheduler] == pytest.approx(sacct_gpu_hours(evaluation.job_id))
    assert evaluation.gpu_hours_job is not None and 0 < evaluation.gpu_hours_job <= evaluation.gpu_hours_scheduler
    ev = ledger.get_evaluation(f"{key}-eval_eval2")
    assert ev.state == "succeeded" and ev.outcome["items"] == 4
    assert ledger.outcome_set(run.experiment_id, "eval2") == {run.id: ev.outcome}
