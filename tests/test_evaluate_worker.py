"""Evaluations after training through the real queue and worker to the local executor: a spec's
[[evaluations]] start by themselves once each run succeeds, `evaluate` queues another set on 2 ranks,
each is an attempt of kind `evaluation` with its own GPU-hours beside a run that stays succeeded,
and `report --outcomes` shows each set with the report's intervals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.spec.parse import load_spec

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "ev"
method = "ggpo"
seeds = [1, 2]
gpus = 4
loop_budget_seconds = 1.5
executor = "local"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
[[evaluations]]
name = "after"
data = "after.jsonl"
"""


def _items(n_train: int, n_heldout: int) -> tuple[list, list]:
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.task.qa import synthetic

    data = synthetic(TrainConfig.from_table({}, "<test>"))
    return list(data.train[:n_train]), list(data.heldout[:n_heldout])


def _write(path: Path, items: list) -> Path:
    path.write_text("".join(json.dumps({"id": i.item_id, "question": i.question, "answers": list(i.answers),
                                        "support_titles": list(i.support_titles)}) + "\n" for i in items))
    return path


@pytest.mark.slow_reason("a training run and its evaluations end to end through an RQ worker")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the ledger's part runs on both in test_evaluations
def test_spec_and_command_evaluations_run_through_the_worker_and_the_report_reads_them(  # type: ignore[no-untyped-def]
        ledger, settings, worker_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.contracts.accounting import gpu_hours
    from ggpo_batch.contracts.allocation import attempt_folder, details_path, evaluation_record_path
    from ggpo_batch.reporting import stats
    from ggpo_batch.reporting.report import experiment_report
    from tests.support.workers import run_burst_worker

    train, heldout = _items(3, 3)
    _write(tmp_path / "after.jsonl", train + heldout)
    (tmp_path / "ev.toml").write_text(SPEC)
    enqueue_spec(ledger, settings, load_spec(tmp_path / "ev.toml"), actor="tester")
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    keys = ["ev-v1-1-clean", "ev-v1-2-clean"]
    for key in keys:
        run = ledger.get_run(key)
        assert run.state == "succeeded", run.cause
        training, evaluation = run.attempts
        assert (training.kind, evaluation.kind) == ("training", "evaluation")
        [ev] = ledger.evaluations(run_ids=[run.id])
        assert (ev.name, ev.source, ev.state) == ("after", "spec", "succeeded"), ev.cause
        assert (evaluation.state, evaluation.executor, evaluation.gpus) == ("succeeded", "local", 1)
        rec = json.loads(evaluation_record_path(attempt_folder(settings.jobs_dir, key, 2)).read_text())
        assert rec["world_size"] == 1 and rec["data"]["items"] == 6
        assert evaluation.gpu_hours_job == pytest.approx(gpu_hours(1, rec["timing"]["elapsed_seconds"]))
        trained = set(json.loads(details_path(attempt_folder(settings.jobs_dir, key, 1)).read_text())
                      ["trained_item_ids"])
        assert trained  # every item the run trained on, kept by the training job
        ids = {i.item_id for i in train + heldout}
        assert set(ledger.get_evaluation(ev.key).outcome["exposed_item_ids"]) == trained & ids

    # `evaluate` on 2 ranks: items the first run trained on, and held-out ones
    first = json.loads(details_path(attempt_folder(settings.jobs_dir, keys[0], 1)).read_text())["trained_item_ids"]
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.task.qa import synthetic

    every = {i.item_id: i for i in synthetic(TrainConfig.from_table({}, "<test>")).train}
    again = _write(tmp_path / "again.jsonl", [every[i] for i in first[:3]] + heldout[1:])
    res = CliRunner().invoke(cli, ["evaluate", "ev", "--data", str(again), "--name", "again", "--gpus", "2",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["enqueued"] == 2
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], dict(os.environ), timeout=600)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    outcomes = []
    for key in keys:
        run = ledger.get_run(key)
        assert run.state == "succeeded" and [a.kind for a in run.attempts] == ["training", "evaluation", "evaluation"]
        third = run.attempts[2]
        assert (third.state, third.gpus) == ("succeeded", 2), third.reason
        rec = json.loads(evaluation_record_path(attempt_folder(settings.jobs_dir, key, 3)).read_text())
        assert rec["world_size"] == 2 and rec["gpus"] == 2
        assert third.gpu_hours_job == pytest.approx(gpu_hours(2, rec["timing"]["elapsed_seconds"]))
        outcome = ledger.get_evaluation(f"{key}-eval_again").outcome
        assert outcome["items"] == 5 and sorted(outcome["item_rewards"]) == sorted(
            [*first[:3], *(i.item_id for i in heldout[1:])])  # both ranks' rows gathered, each item once
        outcomes.append(outcome)
    assert set(outcomes[0]["exposed_item_ids"]) == set(first[:3])  # what run 1 trained on is exposed here

    rep = experiment_report(ledger, "ev", outcomes="again")
    arm = rep["arms"]["clean"]["outcome"]
    assert arm["eval_reward"] == pytest.approx(stats.summary(o["eval_reward"] for o in outcomes))
    assert arm["eval_reward"]["ci95_method"] == "t" and arm["eval_reward"]["n"] == 2
    own = experiment_report(ledger, "ev")  # the training allocation's own set, with the same statistics
    assert own["outcome_set"] == "training" and own["outcome_sets"] == ["training", "after", "again"]
    assert own["arms"]["clean"]["outcome"]["eval_reward"]["ci95_method"] == "t"
    assert own["totals"]["evaluation_gpu_hours"] == pytest.approx(
        sum(a.gpu_hours_job for k in keys for a in ledger.get_run(k).attempts if a.kind == "evaluation"))
    text = CliRunner().invoke(cli, ["report", "ev", "--outcomes", "again"])
    assert text.exit_code == 0 and "outcome set 'again'" in text.stdout
    from ggpo_batch.dashboard.views import run_view

    page = run_view(ledger, settings, keys[0])  # the dashboard's run page: the evaluations beside the run
    assert page["run"]["state_label"] == "succeeded, evaluation after succeeded, again succeeded"
    assert [(e["name"], e["attempts"]) for e in page["evaluations"]] == [("after", [2]), ("again", [3])]
    assert [a["kind"] for a in page["attempts"]] == ["training", "evaluation", "evaluation"]
