"""Sequential waves (control/waves.py): enqueue queues the first wave and holds the later ones;
when a wave has ended, reconcile takes the look per arm, records it (sequential_looks, migration
0012) and cancels a stopped arm's held runs or releases the next wave, through the cost guard. Runs
are finished by hand in the ledger here (fast, both backends); tests/test_waves_worker.py runs a
real CPU experiment through the worker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ggpo_batch.contracts.states import KIND_NOT_REPRODUCED
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.control.waves import take_looks
from ggpo_batch.reporting.advice import advise
from ggpo_batch.reporting.render import footer_lines, report_tables
from ggpo_batch.reporting.report import experiment_report
from ggpo_batch.spec.parse import load_spec
from tests.support.services import wipe_pg

pytestmark = pytest.mark.redis

SPEC = """
schema = 1
[experiment]
name = "w"
method = "ggpo"
seeds = [1, 2, 3, 4, 5]
gpus = 1
loop_budget_seconds = 2
executor = "local"
{cap}
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
[arms.big.train]
lr = 2e-3
[arms.small.train]
lr = 3e-3
[power]
metric = "steps"
design = "sequential"
waves = [3, 5]
"""
# steps of clean per seed; big is 100 above it (a difference no boundary misses), small about level.
CLEAN = {1: 50, 2: 60, 3: 55, 4: 52, 5: 58}
OFFSET = {"clean": {s: 0 for s in CLEAN}, "big": {1: 100, 2: 101, 3: 99, 4: 100, 5: 100},
          "small": {1: 0, 2: 1, 3: -1, 4: 2, 5: -2}}


def _spec(tmp_path: Path, cap: str = ""):  # type: ignore[no-untyped-def]
    p = tmp_path / "w.toml"
    p.write_text(SPEC.format(cap=cap))
    return load_spec(p)


def _finish(ledger, key: str, gpu_hours: float = 0.001) -> None:  # type: ignore[no-untyped-def]
    """Book a run's one attempt as succeeded, with the steps of its arm and seed."""
    run = ledger.get_run(key)
    steps = CLEAN[run.seed] + OFFSET[run.arm][run.seed]
    ledger.begin_attempt(key, executor="local", gpus=1, actor="w", worker="w")
    ledger.mark_submitted(key, 1, job_id=f"{key}-1", actor="w")
    ledger.mark_finished(key, 1, attempt_state="succeeded", run_state="succeeded", actor="w", gpu_hours_job=gpu_hours,
                         result={"arm": run.arm, "seed": run.seed, "training": {"counts": {"steps": steps}},
                                 "budget": {"loop_seconds": 2.0, "budget_seconds": 2.0, "overshoot_fraction": 0.0},
                                 "timing": {"elapsed_seconds": 5.0}})


def _keys(ledger, state: str) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.run_key for r in ledger.runs(states=[state], with_attempts=False)}


def test_a_look_stops_the_arm_that_crossed_and_releases_the_next_wave_of_the_others(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    q = RunQueue.from_url(settings.redis_url, "testq")
    res = enqueue_spec(ledger, settings, spec, actor="tester")
    first = {f"w-v1-{s}-{a}" for s in (1, 2, 3) for a in ("clean", "big", "small")}
    later = {f"w-v1-{s}-{a}" for s in (4, 5) for a in ("clean", "big", "small")}
    assert set(res.held) == later and res.enqueued == 9 and set(q.waiting()) == first
    assert _keys(ledger, "held") == later and _keys(ledger, "queued") == first
    # priced at all its seeds: the held runs' estimates are in the enqueue's total
    assert len(res.estimate.runs) == 15
    assert take_looks(ledger, settings, actor="reconcile") == []  # the wave is still out
    *most, last_one = sorted(first)
    for key in most:
        _finish(ledger, key)
    assert take_looks(ledger, settings, actor="reconcile") == []  # one run of the wave left
    _finish(ledger, last_one)
    rep = reconcile(ledger, settings, [q], actor="reconcile")  # reconcile takes the look
    assert rep.looks == 1
    exp = ledger.latest_experiment("w")
    looks = {lk["arm"]: lk for lk in ledger.looks(exp.id)}
    assert set(looks) == {"big", "small"}
    big, small = looks["big"], looks["small"]
    assert (big["look"], big["looks"], big["seeds"], big["seeds_paired"], big["metric"]) == (1, 2, 3, 3, "steps")
    assert big["decision"] == "crossed" and big["statistic"] > big["boundary"] > 4.3  # wider than the fixed test's
    assert small["decision"] == "continue" and small["statistic"] == pytest.approx(0.0)
    assert small["per_seed"] == {"1": 0.0, "2": 1.0, "3": -1.0} and small["waves"] == [3, 5]
    assert big["alpha"] == pytest.approx(0.025) and big["spending"] == "obrien-fleming"  # holm over 2 arms
    assert big["decided_by"] == "reconcile"
    # big's later runs cancelled with the look's reason; small's and the baseline's released, on the queue
    assert _keys(ledger, "cancelled") == {"w-v1-4-big", "w-v1-5-big"}
    assert "crossed" in ledger.get_run("w-v1-4-big").cause
    assert _keys(ledger, "queued") == {f"w-v1-{s}-{a}" for s in (4, 5) for a in ("clean", "small")}
    assert _keys(ledger, "queued") <= set(q.waiting())
    assert take_looks(ledger, settings, actor="reconcile") == []  # once: nothing due until the wave ends
    # report labels the intervals with the look they were taken at; advise reads the recorded looks
    rep = experiment_report(ledger, "w")
    assert rep["power"]["arms"]["small"]["look"] == {"look": 1, "looks": 2, "seeds": 3, "t": 0.0,
                                                     "boundary": small["boundary"], "crossed": False,
                                                     "futile": False, "next_wave": 5}
    rows = [row[0] for t in report_tables(rep) for row in t.rows]
    assert "small (look 1 of 2)" in rows and "big (look 1 of 2)" in rows
    assert any("(look k of K) is the fixed-sample 95 % interval" in line for line in footer_lines(rep))
    adv = advise(ledger, "w")["arms"]
    assert adv["big"]["verdict"] == "stop" and "recorded by reconcile: crossed" in adv["big"]["reason"]
    assert adv["small"]["verdict"] == "add" and "recorded by reconcile: continue, the next wave released" in (
        adv["small"]["reason"])
    for key in sorted(_keys(ledger, "queued")):
        _finish(ledger, key)
    [step] = take_looks(ledger, settings, actor="reconcile")
    assert (step.look, step.decisions) == (2, {"small": "final"})
    last = [lk for lk in ledger.looks(exp.id) if lk["look"] == 2]
    assert [lk["arm"] for lk in last] == ["small"] and last[0]["seeds_paired"] == 5
    assert _keys(ledger, "held") == set() and take_looks(ledger, settings, actor="reconcile") == []
    assert ledger.looks_due() == []


def test_a_wave_the_cost_guard_refuses_is_decided_not_reproduced(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 15 runs x 1 GPU x 5 s = 0.0208 GPU-h at enqueue: fits 0.05. Wave 1 then spends 0.005 GPU-h a run
    # (0.045, more than estimated): what the cap has left (0.05 - 0.045 - the other held runs' 0.0028)
    # is less than the next wave's 4 runs (0.0056).
    spec = _spec(tmp_path, "max_gpu_hours = 0.05")
    enqueue_spec(ledger, settings, spec, actor="tester")
    for key in sorted(_keys(ledger, "queued")):
        _finish(ledger, key, gpu_hours=0.005)
    [step] = take_looks(ledger, settings, actor="reconcile")
    assert step.decisions == {"big": "crossed", "small": "refused"}
    exp = ledger.latest_experiment("w")
    small = next(lk for lk in ledger.looks(exp.id) if lk["arm"] == "small")
    assert "wave 2 refused by the cost guard" in small["reason"] and "experiment cap" in small["reason"]
    assert _keys(ledger, "cancelled") == {"w-v1-4-big", "w-v1-5-big"}
    left = {f"w-v1-{s}-{a}" for s in (4, 5) for a in ("clean", "small")}
    assert _keys(ledger, "not_reproduced") == left and set(step.not_reproduced) == left
    [d] = ledger.decisions("w")
    assert d.kind == KIND_NOT_REPRODUCED and "wave 2 of 2 refused at look 1" in d.resolution
    assert ledger.get_run("w-v1-4-small").cause == d.reason
    assert take_looks(ledger, settings, actor="reconcile") == [] and ledger.looks_due() == []
    row = advise(ledger, "w")["arms"]["small"]
    assert row["verdict"] == "not_worth_it" and "refused by the cost guard" in row["reason"]
    # The decision stands until a person accepts the cost: a plain enqueue queues nothing.
    assert enqueue_spec(ledger, settings, spec, actor="tester").enqueued == 0 and _keys(ledger, "queued") == set()
    # The cost accepted by a person: the refused wave is queued, and its look taken when it has run.
    res = enqueue_spec(ledger, settings, spec, actor="tester", accept_cost_reason="worth it")
    assert res.enqueued == 4 and res.held == [] and _keys(ledger, "queued") == left
    for key in sorted(left):
        _finish(ledger, key)
    [step] = take_looks(ledger, settings, actor="reconcile")
    assert (step.look, step.decisions) == (2, {"small": "final"}) and ledger.looks_due() == []


def test_accepting_the_cost_of_a_refused_sequential_design_holds_its_later_waves(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.errors import CostCapExceeded

    spec = _spec(tmp_path, "max_gpu_hours = 0.001")
    with pytest.raises(CostCapExceeded):
        enqueue_spec(ledger, settings, spec, actor="tester")
    assert len(_keys(ledger, "not_reproduced")) == 15
    res = enqueue_spec(ledger, settings, spec, actor="tester", accept_cost_reason="a pilot")
    later = {f"w-v1-{s}-{a}" for s in (4, 5) for a in ("clean", "big", "small")}
    assert res.enqueued == 9 and set(res.held) == later and _keys(ledger, "held") == later
    assert len(_keys(ledger, "queued")) == 9 and _keys(ledger, "not_reproduced") == set()


def test_seeds_past_the_last_wave_are_refused(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.errors import SpecError

    p = tmp_path / "w.toml"
    p.write_text(SPEC.format(cap="").replace("waves = [3, 5]", "waves = [2, 4]"))
    with pytest.raises(SpecError, match="lists 5 seeds; the last wave"):
        enqueue_spec(ledger, settings, load_spec(p), actor="tester")
    with pytest.raises(SpecError, match="--seeds: a sequential design queues its seeds wave by wave"):
        enqueue_spec(ledger, settings, _spec(tmp_path), seeds=[4, 5], actor="tester")
    assert ledger.experiments("w") == []


@pytest.mark.postgres
def test_only_the_service_records_looks_and_everyone_reads_them(pg_url: str) -> None:
    """Row-level security on sequential_looks (migration 0012): a member's insert is refused, the
    service's is not; a member reads them."""
    from sqlalchemy import text

    from ggpo_batch.errors import NotPermitted
    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    wipe_pg(pg_url)
    member, service = (f"{kind}_{uuid.uuid4().hex[:8]}" for kind in ("member", "service"))
    admin = make_engine(pg_url)
    upgrade(admin)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {member} LOGIN IN ROLE ggpo_member"))
        conn.execute(text(f"CREATE ROLE {service} LOGIN IN ROLE ggpo_service"))
    row = {"arm": "big", "look": 1, "looks": 2, "seeds": 3, "seeds_paired": 3, "metric": "steps", "statistic": 9.0,
           "boundary": 16.0, "alpha": 0.025, "spending": "obrien-fleming", "waves": [3, 5],
           "per_seed": {"1": 1.0}, "decision": "continue", "reason": "test"}
    try:
        led_m = connect(pg_url.replace("postgres@", f"{member}@", 1), retry_seconds=0)
        led_s = connect(pg_url.replace("postgres@", f"{service}@", 1), retry_seconds=0)
        exp = led_m.create_experiment(name="rls", version=1, method="ggpo", source="spec", spec_hash="h", spec={},
                                      gpus=1, actor=member, runs=[NewRun(run_key="rls-v1-1-clean", arm="clean",
                                                                         seed=1, config_hash="c", run_spec={})])
        with pytest.raises(NotPermitted):
            led_m.record_looks(exp.id, [row], actor=member)
        led_s.record_looks(exp.id, [row], actor=service)
        assert [lk["decision"] for lk in led_m.looks(exp.id)] == ["continue"]
        # a member accepting the cost of their sequential design puts its later wave back on hold
        later = led_m.create_experiment(name="rls", version=2, method="ggpo", source="spec", spec_hash="h2", spec={},
                                        gpus=1, actor=member, initial_state="not_reproduced",
                                        runs=[NewRun(run_key="rls-v2-2-clean", arm="clean", seed=2, config_hash="c",
                                                     run_spec={})])
        _, moved = led_m.apply_decision(experiment_name="rls", kind="cost_accepted", actor=member,
                                        fields={"reason": "worth it", "review_done": True}, experiment_id=later.id,
                                        run_state="queued", hold={"rls-v2-2-clean"})
        assert moved == ["rls-v2-2-clean"] and led_m.get_run("rls-v2-2-clean").state == "held"
        led_m.engine.dispose()
        led_s.engine.dispose()
    finally:
        with admin.begin() as conn:
            for role in (member, service):
                conn.execute(text(f"DROP OWNED BY {role}"))
                conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
        wipe_pg(pg_url)


def test_a_look_short_of_its_wave_cannot_reject_and_futility_stops_an_arm() -> None:
    from ggpo_batch.reporting import sequential as S

    waves = [3, 10]
    bounds = S.boundaries(waves, 0.05)
    full = S.look_at([1.0, 1.01, 0.99], 1, waves, bounds)
    assert full.crossed and full.t > bounds[0] and full.next_wave == 10
    short = S.look_at([5.0, 5.01], 1, waves, bounds)  # a run of the wave failed: 2 of its 3 seeds
    assert short.seeds == 2 and short.t > bounds[0] and not short.crossed and not short.futile
    assert S.look_at([0.1, -0.1, 0.05], 1, waves, bounds, futility=0.2).futile
    assert not S.look_at([0.1, -0.1, 0.05], 1, waves, bounds).futile  # futility off by default
    last = S.look_at([0.1, -0.1, 0.05, 0.2, 0.1, 0, 0, 0, 0, 0.1], 2, waves, bounds, futility=0.2)
    assert (last.look, last.next_wave, last.crossed, last.futile) == (2, None, False, False)
    with pytest.raises(ValueError):
        S.look_at([1.0, 2.0], 3, waves, bounds)
    from ggpo_batch.control.waves import _decision

    assert [_decision(x, "steps", "clean")[0] for x in (full, short, last)] == ["crossed", "continue", "final"]
    assert _decision(S.look_at([0.1, -0.1, 0.05], 1, waves, bounds, futility=0.2), "steps", "clean")[0] == "futile"
