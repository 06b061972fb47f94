from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from ggpo_batch.config.settings import Settings
from ggpo_batch.control import costguard
from ggpo_batch.control.enqueue import new_experiment, new_run
from ggpo_batch.control.importer import import_results
from ggpo_batch.errors import LedgerError
from ggpo_batch.ledger import NewRun
from ggpo_batch.reporting.status import experiment_status
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import REPO, SEED_000, SEED_003

SPEC = REPO / "jobs" / "exposure-5arm.toml"


def _spec(**changes):  # type: ignore[no-untyped-def]
    return replace(load_spec(SPEC), **changes)


def _settings(tmp_path: Path, **caps) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(db_url="sqlite://", redis_url="memory://", data_dir=tmp_path, user="alice", **caps)


def _seed() -> dict:
    return json.loads(SEED_000.read_text())


def _finished_run(ledger, name: str, *, profile: str, gpus: int, elapsed: float, loop: float,  # type: ignore[no-untyped-def]
                  queue: str | None = None, actor: str = "bob") -> None:
    """An experiment with one run that really went through the ledger's transitions to succeeded."""
    key = f"{name}-v1-1-clean"
    ledger.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=name, spec={}, gpus=gpus,
                             actor=actor, queue=queue,
                             runs=[NewRun(run_key=key, arm="clean", seed=1, config_hash="h",
                                          run_spec={"profile": profile}, estimated_gpu_hours=1.0)])
    ledger.begin_attempt(key, executor="debug", gpus=gpus, actor="w", worker="w1")
    ledger.mark_submitted(key, 1, job_id="1", actor="w")
    ledger.mark_running(key, 1, actor="w")
    result = {"budget": {"loop_seconds": loop, "budget_seconds": 2700.0}}
    ledger.mark_finished(key, 1, attempt_state="succeeded", run_state="succeeded", actor="w", elapsed_seconds=elapsed,
                         gpu_hours_job=gpus * elapsed / 3600, result=result)


def test_without_history_the_spec_overheads_are_used(ledger) -> None:  # type: ignore[no-untyped-def]
    spec = _spec()
    est = costguard.estimate(ledger, spec, spec.expand(1))
    assert len(est.runs) == 15
    one = est.runs[0]
    assert one.basis == "spec overheads"
    assert one.loop_seconds == 2700.0 and one.overhead_seconds == 640 + 25 + 60
    assert one.gpu_hours == pytest.approx(4 * (2700 + 725) / 3600, rel=1e-12)
    assert est.total_gpu_hours == pytest.approx(15 * one.gpu_hours, rel=1e-12)
    assert "spec" in est.cost_type and "640" in est.cost_basis and est.cost_basis.startswith("57.08 GPU-h = 15 runs x 4 GPUs")


def test_seed_history_gives_the_seeds_own_cost(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="alice")
    spec = _spec()
    est = costguard.estimate(ledger, spec, spec.expand(1))
    recs = list(_seed().values())
    overhead = statistics.median(r["timing"]["elapsed_seconds"] - r["budget"]["loop_seconds"] for r in recs)
    overshoot = statistics.median(r["budget"]["overshoot_fraction"] for r in recs)
    for e in est.runs:
        assert e.basis == "history (median of 15 attempts)"
        assert e.overhead_seconds == pytest.approx(overhead, rel=1e-12)
        assert e.loop_seconds == pytest.approx(2700 * (1 + overshoot), rel=1e-12)
    median_elapsed = statistics.median(r["timing"]["elapsed_seconds"] for r in recs)
    per_run_seconds = est.runs[0].loop_seconds + est.runs[0].overhead_seconds
    assert per_run_seconds == pytest.approx(median_elapsed, rel=0.01)  # ~3430 s
    assert est.runs[0].gpu_hours == pytest.approx(3.8, abs=0.05)
    spent = sum(r["timing"]["allocated_gpu_hours_through_evaluation"] for r in recs)
    assert est.total_gpu_hours == pytest.approx(spent, rel=0.02)
    assert "history" in est.cost_type and "15 succeeded ggpo attempts" in est.cost_basis and est.cost_basis.startswith("56.8")


def test_history_matches_method_profile_and_gpus(ledger) -> None:  # type: ignore[no-untyped-def]
    _finished_run(ledger, "other-profile", profile="bigmem", gpus=4, elapsed=4000.0, loop=2700.0)
    _finished_run(ledger, "two-gpus", profile="default", gpus=2, elapsed=5000.0, loop=2700.0)
    spec = _spec()
    assert costguard.estimate(ledger, spec, spec.expand(1)).runs[0].basis == "spec overheads"
    _finished_run(ledger, "same", profile="default", gpus=4, elapsed=3000.0, loop=2754.0)
    est = costguard.estimate(ledger, spec, spec.expand(1))
    assert est.runs[0].basis == "history (median of 1 attempts)"
    assert est.runs[0].overhead_seconds == pytest.approx(246.0)
    assert est.runs[0].loop_seconds == pytest.approx(2754.0)  # 2 % overshoot carried over
    # The profile "bigmem" run is history for a bigmem spec, and only for it.
    big = costguard.estimate(ledger, _spec(profile="bigmem"), _spec(profile="bigmem").expand(1))
    assert big.runs[0].overhead_seconds == pytest.approx(1300.0)


def test_experiment_cap(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(max_gpu_hours=40.0)
    est = costguard.estimate(ledger, spec, spec.expand(1))
    check = costguard.check_caps(ledger, spec, est, settings=_settings(tmp_path), user="alice", queue="ggpo")
    assert not check.ok and check.cap_name == "experiment"
    assert check.cap_gpu_hours == 40.0 and check.available_gpu_hours == 40.0
    assert "57.08" in check.message and "experiment cap 40.00" in check.message
    fine = costguard.check_caps(ledger, _spec(), est, settings=_settings(tmp_path), user="alice", queue="ggpo")
    assert fine.ok and fine.cap_name == "experiment" and fine.available_gpu_hours == 64.0
    none = costguard.check_caps(ledger, _spec(max_gpu_hours=None), est, settings=_settings(tmp_path), user="alice",
                                queue="ggpo")
    assert none.ok and none.cap_name is None


def test_user_cap_counts_spent_and_in_flight(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="alice")  # alice spent 57.30 GPU-h
    spec = _spec(max_gpu_hours=None)
    est = costguard.estimate(ledger, spec, spec.expand(1))
    settings = _settings(tmp_path, user_gpu_hours_cap=120.0)
    check = costguard.check_caps(ledger, spec, est, settings=settings, user="alice", queue="ggpo")
    assert check.ok and check.available_gpu_hours == pytest.approx(120.0 - 57.29736219114727, rel=1e-9)
    # bob's queued runs do not count against alice; alice's do, as in flight.
    for who, n in (("bob", 9), ("alice", 2)):
        ledger.create_experiment(name=f"queued-{who}", version=1, method="ggpo", source="spec", spec_hash=who,
                                 spec={}, gpus=4, actor=who, queue="ggpo",
                                 runs=[NewRun(run_key=f"queued-{who}-v1-{i}-clean", arm="clean", seed=i,
                                              config_hash="h", run_spec={}, estimated_gpu_hours=4.0)
                                       for i in range(n)])
    check = costguard.check_caps(ledger, spec, est, settings=settings, user="alice", queue="ggpo")
    assert not check.ok and check.cap_name == "user alice"
    assert check.available_gpu_hours == pytest.approx(120.0 - 57.29736219114727 - 8.0, rel=1e-9)
    assert costguard.check_caps(ledger, spec, est, settings=settings, user="carol", queue="ggpo").ok


def test_queue_cap(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _finished_run(ledger, "spent-on-q", profile="default", gpus=4, elapsed=9000.0, loop=2700.0, queue="q")
    spec = _spec(max_gpu_hours=None)
    est = costguard.estimate(ledger, spec, spec.expand(1, arms=["clean"], seeds=[20261012]))
    settings = _settings(tmp_path, queue_gpu_hours_cap=12.0)
    check = costguard.check_caps(ledger, spec, est, settings=settings, user="alice", queue="q")
    assert not check.ok and check.cap_name == "queue q"
    assert check.available_gpu_hours == pytest.approx(12.0 - 10.0)
    assert costguard.check_caps(ledger, spec, est, settings=settings, user="alice", queue="other").ok


def test_over_cap_records_the_seed_003_decision_and_decided_runs(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(max_gpu_hours=20.0)
    runs = spec.expand(1)
    est = costguard.estimate(ledger, spec, runs)
    check = costguard.check_caps(ledger, spec, est, settings=_settings(tmp_path), user="alice", queue="ggpo")
    per_run = {e.run_key: e.gpu_hours for e in est.runs}
    d = costguard.record_not_reproduced(ledger, spec, est, check, actor="alice",
                                        new_experiment=new_experiment(spec, 1, "ggpo"),
                                        new_runs=[new_run(r, per_run) for r in runs])
    assert ledger.experiments()[0].queue == "ggpo"
    want = json.loads(SEED_003.read_text())["full_experiment"]
    for k in want:
        assert getattr(d, k) is not None, k
    assert d.kind == "not_reproduced_high_cost" == json.loads(SEED_003.read_text())["full_experiment_status"]
    assert d.review_done is False and d.automatic_retry is False and d.decided_by == "alice"
    assert d.cost_basis == est.cost_basis and d.cost_type == est.cost_type
    assert d.estimated_gpu_hours == est.total_gpu_hours and d.cap_gpu_hours == 20.0
    assert "20.00 GPU-h left under the experiment cap" in d.available_budget
    assert "--accept-cost" in d.resolution
    [exp] = experiment_status(ledger)
    assert exp["totals"]["states"] == {"not_reproduced": 15}
    assert exp["totals"]["allocated_gpu_hours"] == 0
    assert exp["decisions"][0]["kind"] == "not_reproduced_high_cost"
    assert all(r["estimated_gpu_hours"] == pytest.approx(4 * 3425 / 3600) for r in exp["runs"])
    # Nothing in flight: a decided run costs nothing and is not counted against the caps.
    assert ledger.committed_gpu_hours(user="alice") == (0.0, 0.0)
    # The same spec decided again links to the same experiment instead of creating another.
    costguard.record_not_reproduced(ledger, spec, est, check, actor="alice",
                                    new_experiment=new_experiment(spec, 1, "ggpo"),
                                    new_runs=[new_run(r, per_run) for r in runs])
    assert len(ledger.experiments()) == 1 and len(ledger.decisions()) == 2

    # Override: the runs go back to queued, with the reason in their events and in the decision.
    with pytest.raises(LedgerError, match="needs --reason"):
        costguard.record_cost_accepted(ledger, spec, est, check, actor="alice", reason="  ")
    acc = costguard.record_cost_accepted(ledger, spec, est, check, actor="alice", reason="PI approved, grant X")
    assert acc.kind == "cost_accepted" and acc.review_done is True and acc.automatic_retry is False
    assert "PI approved" in acc.resolution
    assert {r.state for r in ledger.runs()} == {"queued"}
    key = runs[0].run_key
    last = ledger.events(run_key=key)[-1]
    assert (last.from_state, last.to_state, last.reason) == ("not_reproduced", "queued", "PI approved, grant X")
    assert ledger.committed_gpu_hours(user="alice")[1] == pytest.approx(est.total_gpu_hours)
    assert ledger.committed_gpu_hours(queue="ggpo")[1] == pytest.approx(est.total_gpu_hours)


def test_decision_without_runs_records_only_the_decision(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(max_gpu_hours=1.0)
    est = costguard.estimate(ledger, spec, spec.expand(1))
    check = costguard.check_caps(ledger, spec, est, settings=_settings(tmp_path), user="alice", queue="ggpo")
    d = costguard.record_not_reproduced(ledger, spec, est, check, actor="alice")
    assert d.experiment_id is None and ledger.experiments() == [] and ledger.runs() == []
    assert [x.kind for x in ledger.decisions("exposure-5arm")] == ["not_reproduced_high_cost"]


def test_manual_decision_moves_queued_runs_only(ledger) -> None:  # type: ignore[no-untyped-def]
    runs = [NewRun(run_key=f"big-v1-{i}-clean", arm="clean", seed=i, config_hash="h", run_spec={},
                   estimated_gpu_hours=100.0) for i in range(3)]
    ledger.create_experiment(name="big", version=1, method="ggpo", source="spec", spec_hash="b", spec={}, gpus=4,
                             actor="alice", runs=runs)
    ledger.begin_attempt("big-v1-0-clean", executor="debug", gpus=4, actor="w", worker="w1")
    ledger.mark_submitted("big-v1-0-clean", 1, job_id="7", actor="w")
    with pytest.raises(LedgerError, match="--cost-basis"):
        costguard.decide_not_reproduced(ledger, "big", actor="carol", reason="too big", cost_basis=" ")
    out = costguard.decide_not_reproduced(
        ledger, "big", actor="carol", reason="too expensive after review",
        cost_basis="8000 optimizer updates, 1.7B/4B, 8 responses/prompt; official setup 4 GH200",
        available_budget="one A100")
    assert out.runs_not_reproduced == ("big-v1-1-clean", "big-v1-2-clean")
    d = out.decision
    assert d.review_done is True and d.automatic_retry is False and d.decided_by == "carol"
    assert d.cost_type == costguard.MANUAL_COST_TYPE and "review done" in d.resolution
    states = {r.run_key: r.state for r in ledger.runs()}
    assert states == {"big-v1-0-clean": "submitted", "big-v1-1-clean": "not_reproduced",
                      "big-v1-2-clean": "not_reproduced"}
    assert ledger.get_run("big-v1-1-clean").cause == "too expensive after review"
    # A decision about an experiment never put in the ledger (judged from a paper) is kept too.
    paper = costguard.decide_not_reproduced(ledger, "paper-full", actor="carol", reason="paper setup",
                                            cost_basis="4 GH200 x 8000 updates")
    assert paper.decision.experiment_id is None and paper.runs_not_reproduced == ()


def test_describe_lists_runs_total_and_cap(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(max_gpu_hours=10.0)
    est = costguard.estimate(ledger, spec, spec.expand(1, arms=["clean"]))
    check = costguard.check_caps(ledger, spec, est, settings=_settings(tmp_path), user="alice", queue="ggpo")
    lines = costguard.describe(est, check)
    assert len(lines) == 3 + 4
    assert "estimated total: 11.42 GPU-h for 3 runs" in lines
    assert lines[-1].startswith("  OVER A CAP: ")


RACE_SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = [1, 2]
gpus = 4
loop_budget_seconds = 3600
executor = "local"
[arms.clean]
exposure = "none"
"""


@pytest.mark.slow
@pytest.mark.redis
def test_two_concurrent_enqueues_cannot_both_fit_under_one_user_cap(ledger, db_url: str, redis_url: str,
                                                                     tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The cap check and the ledger write are one critical section: the first enqueue is held
    just after its check (fault pause) while a second one runs; the second must see the first."""
    import os
    import subprocess
    import sys
    import time

    specs = []
    for name in ("race-a", "race-b"):
        p = tmp_path / f"{name}.toml"
        p.write_text(RACE_SPEC.format(name=name))
        specs.append(p)
    spec_a = load_spec(specs[0])
    one = costguard.estimate(ledger, spec_a, spec_a.expand(1)).total_gpu_hours
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_DB_URL=db_url, GGPO_REDIS_URL=redis_url, GGPO_DATA_DIR=str(tmp_path / "data"), GGPO_USER="alice",
               GGPO_USER_GPU_HOURS_CAP=str(1.5 * one))  # room for one experiment, not two

    def enqueue(spec: Path, log: Path, **extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "enqueue", str(spec)],
                                env={**env, **extra}, stdout=log.open("w"), stderr=subprocess.STDOUT)

    first = enqueue(specs[0], tmp_path / "a.log", GGPO_FAULT_PAUSE="after_cost_check=3")
    deadline = time.monotonic() + 60
    while "fault injection: pausing" not in (tmp_path / "a.log").read_text():
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "a.log").read_text()
        time.sleep(0.05)
    second = enqueue(specs[1], tmp_path / "b.log")
    codes = (first.wait(timeout=60), second.wait(timeout=60))
    out_b = (tmp_path / "b.log").read_text()
    assert codes == (0, 3), ((tmp_path / "a.log").read_text(), out_b)
    assert "user alice cap" in out_b and "nothing queued" in out_b
    a, b = ledger.latest_experiment("race-a"), ledger.latest_experiment("race-b")
    assert set(ledger.run_states(a.id).values()) == {"queued"}
    assert set(ledger.run_states(b.id).values()) == {"not_reproduced"}
    [d] = ledger.decisions("race-b")
    assert d.kind == "not_reproduced_high_cost" and d.automatic_retry is False
    spent, in_flight = ledger.committed_gpu_hours(user="alice")
    assert spent == 0.0 and in_flight == pytest.approx(one) and in_flight <= 1.5 * one
