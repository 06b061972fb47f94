"""A run that reaches its time limit: the decision (continue in a new allocation, or end `timeout`),
the cost guard's check before each continuation, the spec keys, and the whole path through a real
worker, whose debug-executor jobs have their save deadline at the allocation's start (so each
allocation does exactly one step, whatever its setup took and the machine's load)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ggpo_batch.control.continuation import TimeLimitNote, judge, read_note
from ggpo_batch.control.costguard import CapCheck, check_continuation
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.errors import SpecError
from ggpo_batch.ledger.schema import Attempt, Run
from ggpo_batch.ledger.submissions import AttemptPlan
from ggpo_batch.reporting.status import continuation_label as label
from ggpo_batch.reporting.status import continuations, run_row, state_label
from ggpo_batch.spec.parse import load_spec, parse_spec

NOTE = TimeLimitNote(step=5, from_step=2, loop_seconds=40.0, budget_seconds=100.0, elapsed_seconds=90.0)


def _run(*, state: str = "running", earlier: tuple[str, ...] = (), continue_on_timeout: bool = True,
         most: int = 3) -> tuple[Run, Attempt]:
    run = Run(run_key="e-v1-1-clean", arm="clean", seed=1, state=state, retries_allowed=0,
              run_spec={"continue_on_timeout": continue_on_timeout, "max_continuations": most})
    atts = [Attempt(number=i + 1, state=s, gpus=4) for i, s in enumerate(earlier)]
    current = Attempt(number=len(atts) + 1, state="running", gpus=4)
    run.attempts = [*atts, current]
    return run, current


def test_a_time_limit_continues_only_with_a_checkpoint_progress_the_flag_a_continuation_left_and_the_cost():
    run, att = _run()
    ok = judge(run, att, NOTE, None)
    assert ok.continues and "continued after time limit (1 of 3)" in ok.reason and "step 5" in ok.reason
    assert not judge(run, att, None, None).continues  # killed at the limit before it checkpointed
    stuck = TimeLimitNote(step=2, from_step=2, loop_seconds=40.0, budget_seconds=100.0, elapsed_seconds=90.0)
    assert "no step done in this allocation" in judge(run, att, stuck, None).reason
    off = judge(*_run(continue_on_timeout=False), NOTE, None)
    assert not off.continues and "continue_on_timeout is off" in off.reason and "retry" in off.reason
    run3, att3 = _run(earlier=("timeout", "preempted", "timeout", "timeout"))
    spent = judge(run3, att3, NOTE, None)
    assert not spent.continues and "no continuation left (max_continuations = 3)" in spent.reason
    run2, att2 = _run(earlier=("timeout", "preempted", "timeout"))
    assert "continued after time limit (3 of 3)" in judge(run2, att2, NOTE, None).reason
    refused = judge(run, att, NOTE, CapCheck(False, "experiment", 1.0, 0.1, "over the experiment cap"))
    assert not refused.continues and "refused by the cost guard: over the experiment cap" in refused.reason


def test_status_says_how_many_times_a_run_continued_of_how_many():
    run, _ = _run(state="running", earlier=("timeout", "timeout"))
    assert continuations(run) == 2 and label(run) == "continued after time limit (2 of 3)"
    assert state_label(run_row(run)) == "running, continued after time limit (2 of 3)"
    ended, _ = _run(state="timeout", earlier=("timeout",))
    ended.attempts[-1].state = "timeout"
    assert label(ended) == "continued after time limit (1 of 3)"  # the last timeout ended the run
    fresh, _ = _run()
    assert label(fresh) is None and "continued" not in state_label(run_row(fresh))


def test_the_note_a_job_writes_is_read_back_and_a_damaged_one_is_none(tmp_path: Path):
    from ggpo_batch.contracts.allocation import time_limit_path

    time_limit_path(tmp_path).write_text(json.dumps({"step": 5, "from_step": 2, "loop_seconds": 40.0,
                                                     "budget_seconds": 100.0, "elapsed_seconds": 90.0}))
    assert read_note(tmp_path) == NOTE and NOTE.remaining_loop_seconds == 60.0
    time_limit_path(tmp_path).write_text('{"step": "x"}')
    assert read_note(tmp_path) is None


SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1]
gpus = 4
loop_budget_seconds = {budget}
executor = "debug"
max_gpu_hours = {cap}
continue_on_timeout = true
max_continuations = {most}
[overheads]
setup_export_seconds = 10
audit_seconds = 10
evaluation_seconds = 10
[train]
max_steps = {steps}
eval_size = 2
[arms.clean]
exposure = "none"
"""


def _spec(tmp_path: Path, name: str, *, budget: float = 600.0, cap: float = 100.0, most: int = 3,  # type: ignore[no-untyped-def]
          steps: int = 3):
    p = tmp_path / f"{name}.toml"
    p.write_text(SPEC.format(name=name, budget=budget, cap=cap, most=most, steps=steps))
    return load_spec(p)


def test_spec_keys_are_checked_and_kept_out_of_the_config_hash(tmp_path: Path):
    spec = _spec(tmp_path, "keys")
    run = spec.expand(1)[0]
    assert (run.continue_on_timeout, run.max_continuations, run.keep_checkpoints) == (True, 3, False)
    plain = parse_spec({"experiment": {"name": "keys", "method": "ggpo", "seeds": [1], "executor": "debug",
                                       "loop_budget_seconds": 600.0, "max_gpu_hours": 100.0},
                        "overheads": {"setup_export_seconds": 10, "audit_seconds": 10, "evaluation_seconds": 10},
                        "train": {"max_steps": 3, "eval_size": 2}, "arms": {"clean": {}}}, "plain.toml")
    assert "continue_on_timeout" not in plain.canonical() and "continue_on_timeout" not in plain.expand(1)[0].to_dict()
    assert plain.expand(1)[0].config_hash == run.config_hash  # where and how long it runs, not what it computes
    for key, value, problem in (("continue_on_timeout", "yes", "must be true or false"),
                                ("max_continuations", -1, "max_continuations"),
                                ("keep_checkpoints", 1, "must be true or false")):
        with pytest.raises(SpecError) as bad:
            parse_spec({"experiment": {"name": "k", "method": "ggpo", "seeds": [1], key: value},
                        "arms": {"clean": {}}}, "k.toml")
        assert f"k.toml: experiment.{key}:" in str(bad.value) and problem in str(bad.value)


def test_the_cost_guard_weighs_a_continuation_against_what_the_experiment_spent(ledger, settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    # estimate per run: 4 GPUs x (600 s loop + 30 s overhead) / 3600 = 0.7 GPU-h; the cap leaves 0.02 to spare
    enqueue_spec(ledger, settings, _spec(tmp_path, "cg", cap=0.72), actor="tester")
    run = ledger.get_run("cg-v1-1-clean")
    fits = check_continuation(ledger, run, spent_now=0.0, remaining_loop_seconds=10.0, settings=settings)
    assert fits.ok and fits.cap_name == "experiment"  # 4 x (10 + 30) / 3600 = 0.044 <= 0.72
    over = check_continuation(ledger, run, spent_now=0.7, remaining_loop_seconds=10.0, settings=settings)
    assert not over.ok and "over the experiment cap 0.72 GPU-h" in over.message


def _note_of(settings, key: str, number: int) -> dict:  # type: ignore[no-untyped-def]
    from ggpo_batch.contracts.allocation import attempt_folder, time_limit_path

    return json.loads(time_limit_path(attempt_folder(settings.jobs_dir, key, number)).read_text())


def test_an_attempt_after_a_time_limit_is_a_continuation(ledger, settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Its kind is decided where the attempt row is begun, on both backends (both ways of beginning one)."""
    enqueue_spec(ledger, settings, _spec(tmp_path, "kinds"), actor="tester")
    key = "kinds-v1-1-clean"
    first = ledger.begin_attempt(key, executor="debug", gpus=4, actor="t", worker="w")
    ledger.mark_submitted(key, first.number, job_id="j1", actor="t")
    ledger.mark_finished(key, first.number, attempt_state="timeout", run_state="queued", actor="t",
                         reason="time limit; continued")
    second = ledger.begin_submission(key, actor="t", worker="w", plan=lambda spec, queue: AttemptPlan("debug", 4)).attempt
    ledger.mark_submitted(key, second.number, job_id="j2", actor="t")
    ledger.book_requeue(key, second.number, actor="t", started_at=None, ended_at=None, elapsed_seconds=1.0,
                        gpu_hours_scheduler=0.001, next_started_at=None)  # Slurm requeued it: same kind
    assert [a.kind for a in ledger.get_run(key).attempts] == ["training", "continuation", "continuation"]
    assert first.kind == "training" and second.kind == "continuation"


@pytest.mark.redis
@pytest.mark.train
@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the ledger's part is checked on both above
def test_runs_continue_past_their_time_limit_through_a_real_worker(ledger, settings, worker_env, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Three experiments in one burst worker, each allocation one step (time limit 1 s, signal delay
    1 s: the save deadline is the allocation's start, so a job stops after its first step however
    quick its setup; with 0.5 s, a payload forked from the preloaded worker once did two steps in one
    allocation): ct-a continues 3 times and succeeds; ct-b may continue once,
    then ends `timeout`; ct-c's continuation is refused by the cost guard. About 90 s under load."""
    from ggpo_batch.contracts.accounting import gpu_hours
    from ggpo_batch.contracts.allocation import TIME_LIMIT_NAME, attempt_folder, checkpoint_folder, details_path
    from tests.support.workers import run_burst_worker

    # ct-c: estimate 4 x (2 + 30) / 3600 = 0.0355556 GPU-h, its cap just that (rounded up); after its
    # first allocation a second one of 4 x (2 - its loop + 30) s no longer fits, by what the first spent
    # outside its loop (setup, save: 0.04 ms would do). A cap of 0.036 needed 0.4 s of that, which a
    # payload forked from the preloaded worker no longer always takes.
    for spec in (_spec(tmp_path, "ct-a"), _spec(tmp_path, "ct-b", most=1, steps=2),
                 _spec(tmp_path, "ct-c", budget=2, cap=0.0355556, steps=2)):
        enqueue_spec(ledger, settings, spec, actor="tester")
    env = dict(os.environ, GGPO_TIME_LIMIT_S="1", GGPO_SIGNAL_DELAY_S="1")
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], env, timeout=400)
    assert done.returncode == 0, done.stderr.decode()[-3000:]

    a = ledger.get_run("ct-a-v1-1-clean")
    assert a.state == "succeeded", (a.cause, [(x.state, x.reason) for x in a.attempts])
    assert [x.state for x in a.attempts] == ["timeout", "timeout", "timeout", "succeeded"]
    assert [x.kind for x in a.attempts] == ["training", "continuation", "continuation", "continuation"]
    assert [x.scheduler_state for x in a.attempts] == ["TIMEOUT"] * 3 + ["COMPLETED"]
    assert [_note_of(settings, a.run_key, n)["step"] for n in (1, 2, 3)] == [1, 2, 3]  # one step each
    assert "continued after time limit (3 of 3)" in a.attempts[2].reason
    rec = a.result
    assert rec["training"]["counts"]["steps"] == 3
    details = json.loads(details_path(attempt_folder(settings.jobs_dir, a.run_key, 4)).read_text())
    shares = details["allocations"]
    assert [(s["from_step"], s["to_step"]) for s in shares] == [(0, 1), (1, 2), (2, 3), (3, 3)]
    # every allocation booked on its own attempt, none twice: the attempts' own figures add up to the
    # record's, which bills all four allocations (and its loop seconds are theirs together)
    assert [x.gpu_hours_job for x in a.attempts] == pytest.approx([gpu_hours(4, s["elapsed_seconds"]) for s in shares])
    assert sum(x.gpu_hours_job for x in a.attempts) == pytest.approx(rec["timing"]["allocated_gpu_hours_through_evaluation"])
    assert rec["budget"]["loop_seconds"] == pytest.approx(sum(s["loop_seconds"] for s in shares))
    # the record booked, its checkpoint went (the spec does not keep it), and the ledger says so
    assert not checkpoint_folder(attempt_folder(settings.jobs_dir, a.run_key, 4)).exists()
    assert any(e.entity == "cleanup" and "checkpoint" in (e.reason or "") for e in ledger.events(run_key=a.run_key))
    assert state_label(run_row(a)) == "succeeded, continued after time limit (3 of 3)"
    from ggpo_batch.dashboard.views import run_view

    page = run_view(ledger, settings, a.run_key)  # what the dashboard's run page shows
    assert page["run"]["state_label"] == "succeeded, continued after time limit (3 of 3)"
    assert [x["kind"] for x in page["attempts"]] == ["training", "continuation", "continuation", "continuation"]
    assert all(x["provenance"]["code"]["commit"] for x in page["attempts"])  # each allocation's own
    # The run's curve: every step, booked by its last attempt from the details' history (which the
    # checkpoints carried); the continued job's curve file started with the steps before it.
    from ggpo_batch.contracts.curve import points_of, read_curve

    assert ledger.curves(a.experiment_id)[a.id]["step"] == [p["step"] for p in points_of(details["history"])] == [0, 1, 2]
    assert [p["step"] for p in read_curve(attempt_folder(settings.jobs_dir, a.run_key, 4))] == [0, 1, 2]

    b = ledger.get_run("ct-b-v1-1-clean")
    assert [x.state for x in b.attempts] == ["timeout", "timeout"] and b.state == "timeout"
    assert "no continuation left (max_continuations = 1)" in b.cause
    assert checkpoint_folder(attempt_folder(settings.jobs_dir, b.run_key, 1)).exists()  # kept for a retry
    assert state_label(run_row(b)) == "timeout, continued after time limit (1 of 1)"
    # no record: its curve is what its last job's curve file held, the first allocation's step too
    assert ledger.curves(b.experiment_id)[b.id]["step"] == [0, 1]

    c = ledger.get_run("ct-c-v1-1-clean")
    assert [x.state for x in c.attempts] == ["timeout"] and c.state == "timeout"
    assert "continuation refused by the cost guard" in c.cause and "experiment cap" in c.cause
    assert (attempt_folder(settings.jobs_dir, c.run_key, 1) / TIME_LIMIT_NAME).exists()


def test_the_save_deadline_counts_from_the_allocations_start(monkeypatch: pytest.MonkeyPatch):
    from ggpo_batch.contracts.allocation import SIGNAL_DELAY_ENV, TIME_LIMIT_ENV, save_deadline, time_limit_export

    assert time_limit_export(600, 90) == f"export {TIME_LIMIT_ENV}=600 {SIGNAL_DELAY_ENV}=90"
    monkeypatch.delenv(TIME_LIMIT_ENV, raising=False)
    assert save_deadline(1000.0) is None  # no time limit told: none assumed
    monkeypatch.setenv(TIME_LIMIT_ENV, "600")
    monkeypatch.setenv(SIGNAL_DELAY_ENV, "90")
    assert save_deadline(1000.0) == 1510.0
    for bad in ("nan", "-5", "inf", "ten"):
        monkeypatch.setenv(TIME_LIMIT_ENV, bad)
        assert save_deadline(1000.0) is None


def test_an_attempt_books_its_own_allocation_not_the_records_sum_of_all(ledger, settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A resumed job's record bills every allocation of the run (seed 000's: 3,433 s); the attempt is
    booked with its own allocation's seconds (the details' 1,000 s), never the earlier ones again."""
    from ggpo_batch.contracts.allocation import details_path, record_path
    from ggpo_batch.control.settlement import settle
    from ggpo_batch.executor.base import JobInfo
    from ggpo_batch.ledger import NewRun
    from tests.support.paths import SEED_000

    _key, rec = next(iter(json.loads(SEED_000.read_text()).items()))
    run_key = "s-v1-1-x"
    ledger.create_experiment(name="s", version=1, method="ggpo", source="spec", spec_hash="x", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key=run_key, arm=rec["arm"], seed=rec["seed"], config_hash="h",
                                                     run_spec={})])
    att = ledger.begin_attempt(run_key, executor="slurm", gpus=4, actor="t", worker="w")
    ledger.mark_submitted(run_key, att.number, job_id="5", actor="t")
    record_path(tmp_path).write_text(json.dumps(rec))
    details_path(tmp_path).write_text(json.dumps({"allocation_elapsed_seconds": 1000.0}))
    run = ledger.get_run(run_key)
    settle(ledger, run, run.attempts[0], JobInfo("5", "COMPLETED", elapsed_seconds=1001.0, alloc_gpus=4), tmp_path,
           actor="t", settings=settings)
    [booked] = ledger.get_run(run_key).attempts
    assert booked.gpu_hours_job == pytest.approx(4 * 1000.0 / 3600)
    assert rec["timing"]["allocated_gpu_hours_through_evaluation"] == pytest.approx(4 * 3433.4450278282166 / 3600)
