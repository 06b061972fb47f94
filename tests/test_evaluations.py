"""Evaluations after training in the ledger, the queue and `evaluate`: each one its own attempt (kind
`evaluation`) beside a run that stays succeeded, with its GPU-hours; queued by `evaluate` or by the
transaction that books a run's success ([[evaluations]]); put back on Redis by reconcile after a
flush; cancelled and retried by hand only; a bad data file refused before anything is written."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.evaluation_spec import EvaluationSpec, evaluation_key
from ggpo_batch.control.evaluation_jobs import check_evaluation_record, conclude
from ggpo_batch.control.evaluations import planned_by_spec, retry_evaluation
from ggpo_batch.control.queue import EVALUATION_JOB_FUNC, RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.control.settlement import settle, settle_own
from ggpo_batch.errors import LedgerError, SpecError
from ggpo_batch.executor.base import JobInfo
from ggpo_batch.ledger import QuotaExceeded
from ggpo_batch.ledger.new_evaluations import NewEvaluation
from ggpo_batch.ledger.submissions import AttemptPlan
from tests.support.evaluations import (
    TRAINED,
    items_file,
    run_spec,
    succeeded_experiment,
    training_files,
)
from tests.support.paths import SEED_000


def _new(run_id: int, key: str, name: str = "eval2", **spec: object) -> NewEvaluation:
    return NewEvaluation(run_id, evaluation_key(key, name), name, "command",
                         {"data_path": "/d.jsonl", "executor": "local", **spec}, 1)


def _plan(spec: dict, queue: str | None) -> AttemptPlan:
    return AttemptPlan("local", 1)


def test_an_evaluation_is_its_own_attempt_beside_a_run_that_stays_succeeded(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    key, other = succeeded_experiment(ledger, tmp_path / "jobs", "ev", queue="evq")
    run = ledger.get_run(key)
    assert ledger.add_evaluations([_new(run.id, key)], actor="alice") == [evaluation_key(key, "eval2")]
    assert ledger.add_evaluations([_new(run.id, key)], actor="alice") == []  # once per run and name
    ek = evaluation_key(key, "eval2")
    assert ledger.queued_evaluation_keys("evq", default_queue="q") == {ek}
    ev, att = ledger.begin_evaluation(ek, actor="w", worker="w1", plan=_plan)
    assert (att.number, att.kind, att.state, att.evaluation_id, att.gpus) == (2, "evaluation", "submitting", ev.id, 1)
    assert ledger.queued_evaluation_keys("evq", default_queue="q") == set()  # being submitted: not put back
    with pytest.raises(LedgerError, match="being submitted"):  # exactly once: nobody else begins it now
        ledger.begin_evaluation(ek, actor="w", worker="w2", plan=_plan)
    ledger.mark_evaluation_submitted(ek, 2, job_id="123", actor="w")
    ledger.mark_evaluation_running(ek, 2, actor="r")
    outcome = {"eval_reward": 0.5, "items": 2}
    ledger.finish_evaluation(ek, 2, attempt_state="succeeded", evaluation_state="succeeded", actor="r",
                             elapsed_seconds=36.0, gpu_hours_job=0.01, gpu_hours_scheduler=0.0101, outcome=outcome,
                             record={"name": "eval2"})
    run = ledger.get_run(key)
    assert run.state == "succeeded" and [a.kind for a in run.attempts] == ["training", "evaluation"]
    assert (run.attempts[1].state, run.attempts[1].gpu_hours_scheduler) == ("succeeded", 0.0101)
    assert ledger.get_evaluation(ek).state == "succeeded"
    assert ledger.outcome_set(run.experiment_id, "eval2") == {run.id: outcome}
    assert ledger.outcome_set_names(run.experiment_id) == ["eval2"]
    moves = [(e.entity, e.from_state, e.to_state) for e in ledger.events(run_key=key) if e.entity == "evaluation"]
    assert moves == [("evaluation", None, "queued"), ("evaluation", "queued", "submitted"),
                     ("evaluation", "submitted", "running"), ("evaluation", "running", "succeeded")]
    assert all((e.reason or "").startswith("evaluation eval2") for e in ledger.events(run_key=key)
               if e.entity == "evaluation")
    with pytest.raises(LedgerError, match="only failed, timeout, lost, cancelled"):
        ledger.requeue_evaluation(ek, actor="bob", reason="again")  # a success is never re-run
    with pytest.raises(LedgerError, match="nothing to cancel"):
        ledger.cancel_evaluation(ek, actor="bob", reason="x")

    # cancelled while being submitted, then retried by hand: a new attempt of the run's next number
    run2 = ledger.get_run(other)
    ledger.add_evaluations([_new(run2.id, other, "other")], actor="alice")
    ok = evaluation_key(other, "other")
    ledger.begin_evaluation(ok, actor="w", worker="w1", plan=_plan)
    ledger.cancel_evaluation(ok, actor="bob", reason="wrong file")
    assert [a.state for a in ledger.get_run(other).attempts] == ["succeeded", "cancelled"]
    with pytest.raises(LedgerError, match="needs a reason"):
        ledger.requeue_evaluation(ok, actor="bob", reason=" ")
    ledger.requeue_evaluation(ok, actor="bob", reason="mended")
    _ev, att = ledger.begin_evaluation(ok, actor="w", worker="w1", plan=_plan)
    assert att.number == 3
    # the queue's GPU quota counts it: a second evaluation over the quota writes nothing
    ledger.add_evaluations([_new(run2.id, other, "third")], actor="alice")
    ledger.resolve_evaluation_submitting(ok, 3, job_id="77", actor="w", reason="found")  # submitted: in flight
    with pytest.raises(QuotaExceeded):
        ledger.begin_evaluation(evaluation_key(other, "third"), actor="w", worker="w1",
                                plan=lambda s, q: AttemptPlan("local", 1, ("evq", 1)))
    assert len(ledger.get_run(other).attempts) == 3
    # a worker that died before sbatch: lost (never retried automatically)
    ledger.finish_evaluation(ok, 3, attempt_state="failed", evaluation_state="failed", actor="r", reason="boom")
    _ev, att = ledger.begin_evaluation(evaluation_key(other, "third"), actor="w", worker="w1", plan=_plan)
    ledger.resolve_evaluation_submitting(evaluation_key(other, "third"), att.number, job_id=None, actor="rec",
                                         reason="worker died")
    assert ledger.get_evaluation(evaluation_key(other, "third")).state == "lost"
    assert ledger.get_run(other).state == "succeeded"


@pytest.mark.redis
def test_spec_evaluations_are_queued_by_the_success_and_survive_a_redis_flush(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.ledger import NewRun

    _key, rec = next(iter(json.loads(SEED_000.read_text()).items()))
    data = items_file(tmp_path / "eval2.jsonl", ["syn-0001", "new-1"])
    asked = [{"name": "eval2", "data": str(data), "gpus": 1},
             {"name": "gone", "data": str(tmp_path / "absent.jsonl"), "gpus": 1}]
    keys = [f"sp-v1-{rec['seed']}-{rec['arm']}", f"sp-v1-{rec['seed'] + 1}-{rec['arm']}"]
    runs = [NewRun(run_key=k, arm=rec["arm"], seed=rec["seed"] + i, config_hash="h",
                   run_spec=run_spec(k, rec["arm"], rec["seed"] + i, evaluations=asked)) for i, k in enumerate(keys)]
    ledger.create_experiment(name="sp", version=1, method="ggpo", source="spec", spec_hash="s", spec={}, gpus=4,
                             actor="t", runs=runs, queue="testq")
    from ggpo_batch.contracts.allocation import record_path

    for i, k in enumerate(keys):
        folder = training_files(settings.jobs_dir, k)
        record_path(folder).write_text(json.dumps({**rec, "seed": rec["seed"] + i}))
        att = ledger.begin_attempt(k, executor="local", gpus=4, actor="w", worker="w")
        ledger.mark_submitted(k, 1, job_id=f"j{i}", actor="w")
        info = JobInfo(job_id=f"j{i}", state="COMPLETED", elapsed_seconds=40.0)
        if i == 0:  # reconcile's way
            settle(ledger, ledger.get_run(k), att, info, folder, actor="rec", settings=settings)
        else:  # the worker's own (it reads the run spec itself when not given)
            settle_own(ledger, k, 1, info, folder, actor="w", settings=settings, queue="testq")
    q = RunQueue.from_url(settings.redis_url, "testq")
    for k in keys:
        run = ledger.get_run(k)
        assert run.state == "succeeded" and [a.kind for a in run.attempts] == ["training"]
        evs = {e.name: e for e in ledger.evaluations(run_ids=[run.id])}
        assert evs["eval2"].state == "queued" and evs["eval2"].source == "spec"
        spec = EvaluationSpec.from_dict(evs["eval2"].spec)
        assert (spec.items, spec.gpus, spec.data_path, spec.run_key) == (2, 1, str(data), k)
        assert evs["gone"].state == "failed" and "absent.jsonl is absent" in (evs["gone"].cause or "")
    queued = {evaluation_key(k, "eval2") for k in keys}
    assert q.present() == queued
    assert {j.func_name for j in q.queue.get_jobs()} == {EVALUATION_JOB_FUNC}
    # Redis flushed: reconcile puts back what the ledger has queued, once
    q.connection.flushdb()
    rep = reconcile(ledger, settings, [q], actor="rec", stale_after=timedelta(0))
    assert rep.requeued == 2 and q.present() == queued
    assert reconcile(ledger, settings, [q], actor="rec").requeued == 0
    # retried by hand only: the one whose file was absent, once it is there, gets its file's checks now
    gone = evaluation_key(keys[0], "gone")
    with pytest.raises(SpecError, match="absent.jsonl is absent"):
        retry_evaluation(ledger, settings, gone, actor="bob", reason="copied")
    items_file(tmp_path / "absent.jsonl", ["z"])
    ev = retry_evaluation(ledger, settings, gone, actor="bob", reason="copied")
    assert ev.state == "queued" and ev.spec["items"] == 1 and ev.spec["policy_dir"] and gone in q.present()
    # a data file changed under an outcome set is refused: the set would mix two files
    first = evaluation_key(keys[0], "eval2")
    _ev, att = ledger.begin_evaluation(first, actor="w", worker="w", plan=_plan)
    ledger.finish_evaluation(first, att.number, attempt_state="node_fail", evaluation_state="failed", actor="r",
                             job_id="n1", reason="NODE_FAIL")
    assert ledger.get_evaluation(first).state == "failed"  # not retried by itself
    items_file(data, ["syn-0001", "new-2"])
    with pytest.raises(SpecError, match="changed since outcome set 'eval2' was queued"):
        retry_evaluation(ledger, settings, first, actor="bob", reason="again")


def test_planned_evaluations_need_the_trained_items_and_a_valid_file(tmp_path: Path) -> None:
    data = items_file(tmp_path / "d.jsonl", ["a"])
    spec = run_spec("x-v1-1-clean", "clean", 1, evaluations=[{"name": "e", "data": str(data), "gpus": 1}])
    [ok] = planned_by_spec(spec, "x-v1-1-clean", training_files(tmp_path, "x-v1-1-clean"))
    assert ok.state == "queued" and ok.spec["data_sha256"]
    [old] = planned_by_spec(spec, "x-v1-1-clean", training_files(tmp_path, "x-v1-1-clean", 2, trained=None))
    assert old.state == "failed" and "no trained_item_ids" in (old.cause or "")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q"}\n')
    spec["evaluations"][0]["data"] = str(bad)
    [refused] = planned_by_spec(spec, "x-v1-1-clean", training_files(tmp_path, "x-v1-1-clean", 3))
    assert refused.state == "failed" and "lacks 'answers'" in (refused.cause or "")
    assert planned_by_spec(run_spec("y", "clean", 1), "y", tmp_path) == []


BAD_FILES = {
    "not JSON": ("{\"id\": \"a\"\n", "bad.jsonl:1: is not valid JSON"),
    "a field missing": ('{"id": "a", "question": "q", "answers": ["x"]}\n', "lacks 'support_titles'"),
    "an id twice": ('{"id": "a", "question": "q", "answers": ["x"], "support_titles": []}\n' * 2,
                    "id 'a' repeats line 1"),
    "empty": ("", "holds no item"),
}


@pytest.mark.redis
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_bad_data_file_is_refused_at_evaluate_time(case: str, env, redis_url: str, ledger, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    succeeded_experiment(ledger, Path(env["GGPO_DATA_DIR"]) / "jobs", "ex")
    text, message = BAD_FILES[case]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    res = CliRunner().invoke(cli, ["evaluate", "ex", "--data", str(bad), "--name", "eval2"])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: evaluate: --data: "), res.output
    assert message in lines[0] and str(bad) in lines[0]
    assert ledger.evaluations() == [] and RunQueue.from_url(redis_url, "ggpo").present() == set()


@pytest.mark.redis
def test_evaluate_queues_one_per_succeeded_run_and_refuses_what_it_cannot_run(env, redis_url: str, ledger,  # type: ignore[no-untyped-def]
                                                                             tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    jobs = Path(env["GGPO_DATA_DIR"]) / "jobs"
    keys = succeeded_experiment(ledger, jobs, "ex", seeds=(1, 2, 3))
    training_files(jobs, keys[2], trained=None)  # trained before evaluations existed: left out, with why
    data = items_file(tmp_path / "eval2.jsonl", ["syn-0001", "new-1", "new-2"])

    def run(*args: str) -> tuple[int, str, str]:
        res = CliRunner().invoke(cli, ["evaluate", "ex", *args])
        return res.exit_code, res.stdout, res.stderr

    code, out, err = run("--data", str(data), "--name", "eval2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["data"]["items"] == 3 and doc["enqueued"] == 2
    assert [(e["run_key"], e["state"], e["new"]) for e in doc["evaluations"]] == [(k, "queued", True) for k in keys[:2]]
    assert [s["run_key"] for s in doc["skipped"]] == [keys[2]] and "trained_item_ids" in doc["skipped"][0]["reason"]
    assert RunQueue.from_url(redis_url, "ggpo").present() == {evaluation_key(k, "eval2") for k in keys[:2]}
    code, out, _ = run("--data", str(data), "--name", "eval2", "--json")  # again: nothing new
    assert code == 0 and json.loads(out)["enqueued"] == 0 and not any(e["new"] for e in json.loads(out)["evaluations"])
    other = items_file(tmp_path / "other.jsonl", ["x"])
    for args, message in ((["--data", str(other), "--name", "eval2"], "already has outcome set 'eval2'"),
                          (["--data", str(data), "--name", "training"], "the training allocation's own"),
                          (["--data", str(data), "--name", "a-b"], "letters, digits and '_'"),
                          (["--data", str(tmp_path / "nope.jsonl"), "--name", "e3"], "is absent from this machine")):
        code, out, err = run(*args)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (args, err)
    assert len(ledger.evaluations()) == 2

    # cancelled: one waiting on Redis (its job removed), one whose job runs (cancelled by its executor);
    # reconcile then books the running one's attempt, and the evaluation stays cancelled
    waiting, running = (evaluation_key(k, "eval2") for k in keys[:2])
    _ev, att = ledger.begin_evaluation(running, actor="w", worker="w", plan=lambda s, q: AttemptPlan("debug", 1))
    ledger.mark_evaluation_submitted(running, att.number, job_id="debug-77", actor="w")
    res = CliRunner().invoke(cli, ["cancel", "--experiment", "ex", "--evaluation", "eval2", "--json"])
    assert res.exit_code == 0, res.output
    done = {c["run_key"]: c for c in json.loads(res.stdout)["cancelled"]}
    assert done[keys[0]]["removed_jobs"] == 1 and done[keys[0]]["was"] == "queued"
    assert done[keys[1]]["cancelled_job"] == "debug-77" and done[keys[1]]["was"] == "submitted"
    assert {ledger.get_evaluation(k).state for k in (waiting, running)} == {"cancelled"}
    assert RunQueue.from_url(redis_url, "ggpo").present() == set()
    from ggpo_batch.config.settings import load_settings

    reconcile(ledger, load_settings(), [RunQueue.from_url(redis_url, "ggpo")], actor="rec")
    assert ledger.get_run(keys[1]).attempts[-1].state == "lost"  # a debug job of another process
    assert ledger.get_evaluation(running).state == "cancelled" and ledger.get_run(keys[1]).state == "succeeded"


def test_report_reads_a_named_outcome_set_with_the_same_intervals(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The 5-arm experiment of test_report_outcomes, then an outcome set whose figures are those of a
    second reward table, booked through evaluation attempts: `report --outcomes` gives the set's
    figures with the report's own statistics, and the training figures stay as they were."""
    from ggpo_batch.contracts.outcome import outcome_from_evaluation
    from ggpo_batch.reporting.report import experiment_report
    from tests.test_report_outcomes import ARMS, REWARDS, SEEDS, _evaluation, build

    build(ledger)
    before = experiment_report(ledger, "five")
    shifted = {arm: [(e + 0.1, u - 0.1) for e, u in rows] for arm, rows in REWARDS.items()}
    for arm in ARMS:
        for seed in SEEDS:
            run = ledger.get_run(f"five-v1-{seed}-{arm}")
            key = evaluation_key(run.run_key, "eval2")
            ledger.add_evaluations([_new(run.id, run.run_key)], actor="t")
            _ev, att = ledger.begin_evaluation(key, actor="w", worker="w", plan=_plan)
            ledger.mark_evaluation_submitted(key, att.number, job_id=f"e{run.id}", actor="w")
            saved, REWARDS[arm] = REWARDS[arm], shifted[arm]
            try:
                outcome = outcome_from_evaluation(_evaluation(arm, seed))
            finally:
                REWARDS[arm] = saved
            ledger.finish_evaluation(key, att.number, attempt_state="succeeded", evaluation_state="succeeded",
                                     actor="w", gpu_hours_job=0.002, outcome=outcome)
    training = experiment_report(ledger, "five")
    assert training["arms"] == before["arms"] and training["paired_vs_baseline"] == before["paired_vs_baseline"]
    assert training["warnings"] == before["warnings"] == []  # evaluation attempts are no retries
    assert training["outcome_set"] == "training" and training["outcome_sets"] == ["training", "eval2"]
    assert training["totals"]["evaluation_gpu_hours"] == pytest.approx(15 * 0.002)
    assert training["totals"]["spent_gpu_hours"] == pytest.approx(before["totals"]["spent_gpu_hours"] + 15 * 0.002)
    rep = experiment_report(ledger, "five", outcomes="eval2")
    assert rep["outcome_set"] == "eval2"
    from ggpo_batch.reporting import stats

    for arm in ARMS:
        every = [(e + u) / 2 if arm != "clean" else u for e, u in shifted[arm]]  # 4 items of each, or all u
        assert rep["arms"][arm]["outcome"]["eval_reward"] == pytest.approx(stats.summary(every))
        assert rep["arms"][arm]["outcome"]["eval_reward"]["ci95_method"] == \
            training["arms"][arm]["outcome"]["eval_reward"]["ci95_method"] == "t"
    # paired on the same items: the arm's exposed items vs the baseline run's reward on them
    diffs = [shifted["paired"][i][0] - shifted["clean"][i][1] for i in range(3)]
    assert rep["paired_vs_baseline"]["paired"]["exposed_reward"]["mean"] == pytest.approx(sum(diffs) / 3)
    assert rep["paired_vs_baseline"]["paired"]["exposed_reward"] != \
        training["paired_vs_baseline"]["paired"]["exposed_reward"]
    with pytest.raises(LedgerError, match="no outcome set 'nope' .*sets: training, eval2"):
        experiment_report(ledger, "five", outcomes="nope")


def _record(spec: EvaluationSpec, rows: list[dict], **over: object) -> dict:
    from ggpo_batch.train.run.evaluation import summarize

    ev = summarize(rows, TRAINED, planned=1, how={"decoding": "greedy", "temperature": 0.0, "samples": 1})
    return {"evaluation_record": 1, "run_key": spec.run_key, "name": spec.name,
            "data": {"path": spec.data_path, "sha256": spec.data_sha256, "items": spec.items},
            "evaluation": ev, "timing": {"elapsed_seconds": 72.0}, **over}


def test_an_evaluation_record_is_checked_before_its_outcome_is_booked(tmp_path: Path) -> None:
    """Planted defects in the job's record: each makes the attempt fail, with the reason."""
    from ggpo_batch.contracts.allocation import evaluation_record_path
    from ggpo_batch.ledger.schema import Attempt, Evaluation

    folder = training_files(tmp_path, "x-v1-1-clean")
    from ggpo_batch.contracts.allocation import details_path

    spec = EvaluationSpec(key="x-v1-1-clean-eval_e", name="e", run_key="x-v1-1-clean", data_path="/d", data_sha256="ab",
                          items=2, gpus=2, policy_dir="/p", details_path=str(details_path(folder)), run_spec={})
    rows = [{"item_id": "syn-0001", "gold": "g", "rewards": [1.0], "answers": ["g"]},
            {"item_id": "new", "gold": "g", "rewards": [0.0], "answers": ["h"]}]
    good = _record(spec, rows)
    trained = set(TRAINED)
    assert check_evaluation_record(good, spec, trained) == []
    wrong_exposure = json.loads(json.dumps(good))
    wrong_exposure["evaluation"]["per_item"][1]["exposed"] = True
    other_data = {**good, "data": {**good["data"], "sha256": "cd"}}
    missing = _record(spec, rows[:1])
    assert check_evaluation_record({**good, "policy_sha256": "p1"}, spec, trained, "p1") == []
    assert any("another policy" in p for p in check_evaluation_record({**good, "policy_sha256": "p2"}, spec, trained,
                                                                      "p1"))
    for rec, why in ((wrong_exposure, "exposure that disagrees"), (other_data, "another data file"),
                     (missing, "1 rows for 1 distinct items; the data file has 2"),
                     ({**good, "run_key": "y"}, "not x-v1-1-clean/e")):
        assert any(why in p for p in check_evaluation_record(rec, spec, trained)), why
    ev = Evaluation(key=spec.key, name="e", state="running", spec=spec.to_dict())
    att = Attempt(number=2, gpus=2, state="running")
    done = JobInfo(job_id="1", state="COMPLETED", elapsed_seconds=80.0)
    out = evaluation_record_path(tmp_path / "attempt")
    out.parent.mkdir()
    assert conclude(ev, att, done, out.parent)["reason"] == "the job ended without writing its evaluation record"
    out.write_text(json.dumps(wrong_exposure))
    fields = conclude(ev, att, done, out.parent)
    assert (fields["attempt_state"], fields["evaluation_state"]) == ("failed", "failed")
    assert "exposure that disagrees" in fields["reason"] and fields["outcome"] is None
    out.write_text(json.dumps(good))
    fields = conclude(ev, att, done, out.parent)
    assert fields["attempt_state"] == "succeeded" and fields["outcome"]["exposed_item_ids"] == ["syn-0001"]
    assert fields["gpu_hours_job"] == pytest.approx(2 * 72.0 / 3600)  # the job's own clock, its GPUs
    assert "per_item" not in fields["record"]["evaluation"]  # the rows live in the outcome's item rewards
    ev.state = "cancelled"  # cancelled meanwhile: the attempt is booked, the evaluation not moved
    assert conclude(ev, att, JobInfo(job_id="1", state="CANCELLED"), out.parent)["evaluation_state"] is None


def test_a_specs_evaluations_are_checked_when_it_is_parsed_and_by_preflight(tmp_path: Path) -> None:
    from ggpo_batch.errors import SpecError as Refused
    from ggpo_batch.spec import preflight
    from ggpo_batch.spec.parse import load_spec

    head = ('schema = 1\n[experiment]\nname = "sp"\nmethod = "ggpo"\nseeds = [1]\nexecutor = "{executor}"\n'
            'profile = "dev-cluster"\ngpus = 4\n[arms.clean]\nexposure = "none"\n')
    good = items_file(tmp_path / "good.jsonl", ["a"])
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\n')

    def spec(executor: str, *tables: str) -> Path:
        p = tmp_path / "sp.toml"
        p.write_text(head.format(executor=executor) + "".join(f"[[evaluations]]\n{t}\n" for t in tables))
        return p

    for tables, message in (((f'name = "training"\ndata = "{good}"',), "the training allocation's own"),
                            (('name = "a"\ndata = "x"\nsteps = 3',), "evaluations[0].steps: unknown field"),
                            (('name = "a"\ndata = "x"', 'name = "a"\ndata = "y"'), "'a' names two evaluations"),
                            (('name = "a"\ndata = "x"\ngpus = 0',), "evaluations[0].gpus: must be an integer")):
        with pytest.raises(Refused, match=re.escape(message)):
            load_spec(spec("debug", *tables))
    parsed = load_spec(spec("slurm", 'name = "e2"\ndata = "good.jsonl"'))  # relative to the spec's folder
    assert parsed.evaluations[0].data == str(good) and parsed.evaluations[0].gpus == 1
    assert parsed.expand(1)[0].evaluations == ({"name": "e2", "data": str(good), "gpus": 1},)
    assert "evaluations" not in load_spec(spec("slurm")).canonical()  # a spec without them hashes as before
    report = preflight.check(load_spec(spec("slurm", 'name = "e2"\ndata = "bad.jsonl"\ngpus = 8',
                                            'name = "e3"\ndata = "good.jsonl"')))
    problems = {p.field: p.message for p in report.problems}
    assert "lacks 'question'" in problems["evaluations[0].data"]
    assert "8 GPUs do not fit a node of profile 'dev-cluster'" in problems["evaluations[0].gpus"]
    assert not any(f.startswith("evaluations[1]") for f in problems)
