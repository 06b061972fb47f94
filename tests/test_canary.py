"""The canary before a sweep (control/canary.py, ledger/canaries.py, contracts/canary_spec.py): its
spec keys and defaults, the runs an enqueue holds for it, its job submitted by the worker's job (the
debug executor: the real canary job, train/run/canary.py, on the CPU), pass -> the held runs released,
fail -> cancelled with the canary's reason and a `canary_failed` notification, `canary --rerun`, and
its attempts (kind `canary`) in the caps, `costs` and the report; on SQLite and PostgreSQL, against
the real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts import states
from ggpo_batch.contracts.canary_spec import (
    CANARY_FAULT_ENV,
    canary_specs,
    shape_of,
    wanted,
)
from ggpo_batch.control.canary import submit_canary
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.spec.parse import load_spec
from tests.test_queue import SPEC

pytestmark = pytest.mark.redis

DEBUG = SPEC.replace('executor = "local"', 'executor = "debug"\ncanary = true')


def _spec(tmp_path: Path, text: str = DEBUG):  # type: ignore[no-untyped-def]
    p = tmp_path / "q.toml"
    p.write_text(text)
    return load_spec(p)


def test_canary_keys_are_absent_at_their_default_and_the_default_is_automatic(tmp_path: Path) -> None:
    plain, on = _spec(tmp_path, SPEC), _spec(tmp_path, SPEC.replace('executor = "local"', 'executor = "local"\n'
                                                                      'canary = true\ncanary_minutes = 5'))
    assert plain.canary is None and not {"canary", "canary_gpus", "canary_minutes"} & set(plain.canonical())
    assert on.canonical()["canary"] is True and on.canonical()["canary_minutes"] == 5
    assert plain.spec_hash != on.spec_hash
    runs = plain.expand(1)
    vllm = [r.__class__(**{**r.__dict__, "train": {"rollout": "vllm"}}) for r in runs]
    assert not wanted(None, "slurm", runs)  # torch rollouts
    assert wanted(None, "slurm", vllm) and not wanted(None, "slurm", vllm[:3]) and not wanted(None, "local", vllm)
    assert wanted(True, "debug", runs[:1]) and not wanted(False, "slurm", vllm)
    # one canary per shape: the paired arm's runs share the clean arm's
    assert len(canary_specs(runs)) == 1 and shape_of({})["zero_stage"] == 2
    mixed = runs[:2] + [r.__class__(**{**r.__dict__, "train": {"zero_stage": 3}}) for r in runs[2:]]
    specs = canary_specs(mixed, gpus=2, minutes=7)
    assert [len(c.run_keys) for c in specs] == [2, 2] and {c.gpus for c in specs} == {2}
    with pytest.raises(Exception, match="canary_minutes"):
        _spec(tmp_path, DEBUG.replace("canary = true", "canary = true\ncanary_minutes = 0"))


def test_the_held_state_may_come_back_from_a_canary_cancellation_only() -> None:
    assert {s for s in states.RUN_STATES if states.can_move(s, "held")} == {"not_reproduced", "cancelled"}
    assert states.ATTEMPT_KIND_CANARY in states.ATTEMPT_KINDS
    assert states.ATTEMPT_KIND_CANARY not in states.TRAINING_ATTEMPT_KINDS


def _start(ledger, settings, tmp_path):  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    res = enqueue_spec(ledger, settings, spec, actor="tester")
    keys = sorted(r.run_key for r in spec.expand(1))
    assert res.enqueued == 0 and sorted(res.held) == keys and len(res.canaries) == 1
    assert res.estimate is not None and "canary allocation" in res.estimate.cost_basis
    q = RunQueue.from_url(settings.redis_url, "testq")
    assert q.present() == set(res.canaries)  # the canary's job only: no run before it passes
    return spec, res, keys, q


def test_a_passing_canary_releases_the_held_runs(ledger, settings, worker_env, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(CANARY_FAULT_ENV, raising=False)
    spec, res, keys, q = _start(ledger, settings, tmp_path)
    [key] = res.canaries
    # A repeated enqueue starts no second canary and queues nothing.
    again = enqueue_spec(ledger, settings, spec, actor="tester")
    assert again.canaries == [] and again.enqueued == 0
    out = submit_canary(ledger, settings, key, worker="w-test")
    assert out["state"] == "passed", out
    assert {ledger.get_run(k).state for k in keys} == {"queued"}
    assert q.present() >= set(keys)
    c = ledger.canary(key)
    assert c.state == "passed" and c.reason is None
    assert [k["name"] for k in c.record["checks"]] == ["sleep_wake_generation", "probe_baseline", "weight_push",
                                                       "zero_overlap_comm"]
    assert c.record["checks"][0]["skipped_sleep_wake"] is True  # the CPU: no sleep/wake
    run = ledger.get_run(c.run.run_key)
    [att] = run.attempts
    assert att.kind == "canary" and att.state == "succeeded" and att.gpu_hours_job > 0
    # The canary's GPU-hours count against the caps and are in costs and the report.
    spent, _ = ledger.committed_gpu_hours(experiment_id=ledger.latest_experiment("q").id)
    assert spent == pytest.approx(att.gpu_hours_job)
    from ggpo_batch.reporting.report import experiment_report

    rep = experiment_report(ledger, "q")
    assert rep["canaries"][0]["state"] == "passed" and rep["canaries"][0]["gpu_hours"] == pytest.approx(spent)
    costs = CliRunner().invoke(cli, ["costs", "--by", "experiment", "--json"], env=worker_env, catch_exceptions=False)
    assert json.loads(costs.output)["rows"][0]["gpu_hours"] == pytest.approx(spent)
    shown = CliRunner().invoke(cli, ["canary", "q", "--json"], env=worker_env, catch_exceptions=False)
    doc = json.loads(shown.output)
    assert shown.exit_code == 0 and doc["schema"] == 1 and doc["canaries"][0]["state"] == "passed"
    assert submit_canary(ledger, settings, key, worker="w-test") == {"canary": key, "skipped": "passed"}


def test_a_failing_canary_cancels_the_held_runs_and_a_rerun_releases_them(
        ledger, settings, worker_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    _, res, keys, q = _start(ledger, settings, tmp_path)
    [key] = res.canaries
    monkeypatch.setenv(CANARY_FAULT_ENV, "push_skips_layer")
    out = submit_canary(ledger, settings, key, worker="w-test")
    assert out["state"] == "failed", out
    c = ledger.canary(key)
    assert c.state == "failed" and c.reason.startswith("weight_push failed")
    assert {ledger.get_run(k).state for k in keys} == {"cancelled"}
    assert all(ledger.get_run(k).cause.startswith(states.CANARY_CANCEL_PREFIX + "weight_push failed") for k in keys)
    assert not q.present() & set(keys)  # no run ever reached the queue
    [note] = [n for n, _ in ledger.notifications(undelivered=False) if n.kind == "canary_failed"]
    assert note.fields["reason"].startswith("weight_push failed") and "canary of" in note.subject
    # status / report / the command say why.
    from ggpo_batch.reporting.report import experiment_report

    assert experiment_report(ledger, "q")["canaries"][0]["reason"].startswith("weight_push failed")
    shown = CliRunner().invoke(cli, ["canary", "q@1"], env=worker_env, catch_exceptions=False)
    assert shown.exit_code == 1 and "weight_push: FAILED" in shown.output
    status = CliRunner().invoke(cli, ["status", "-e", "q"], env=worker_env, catch_exceptions=False)
    assert f"canary {key} (" in status.output and "failed: weight_push failed" in status.output
    assert "--rerun` after a fix" in status.output
    # Re-run after the fix: the cancelled runs go back to held, and are released when it passes.
    monkeypatch.delenv(CANARY_FAULT_ENV)
    rerun = CliRunner().invoke(cli, ["canary", "q", "--rerun", "--json"], env=worker_env, catch_exceptions=False)
    assert rerun.exit_code == 0 and json.loads(rerun.output)["rerun"] == [key]
    assert {ledger.get_run(k).state for k in keys} == {"held"} and key in q.present()
    assert submit_canary(ledger, settings, key, worker="w-test")["state"] == "passed"
    assert {ledger.get_run(k).state for k in keys} == {"queued"}
    assert [a.kind for a in ledger.get_run(c.run.run_key).attempts] == ["canary", "canary"]
    bad = CliRunner().invoke(cli, ["canary", "q", "--rerun"], env=worker_env)
    assert bad.exit_code == 2 and "no failed canary" in bad.output
    assert CliRunner().invoke(cli, ["canary", "nope"], env=worker_env).exit_code == 2


def test_a_run_cancelled_by_hand_does_not_come_back_with_a_rerun(ledger, settings, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.control.canary import rerun
    from ggpo_batch.control.interventions import cancel_runs

    _, res, keys, _q = _start(ledger, settings, tmp_path)
    cancel_runs(ledger, settings, [keys[0]], actor="tester", reason="not needed")
    monkeypatch.setenv(CANARY_FAULT_ENV, "probe_over_ceiling")
    assert submit_canary(ledger, settings, res.canaries[0], worker="w-test")["state"] == "failed"
    assert rerun(ledger, settings, "q", actor="tester") == res.canaries
    assert ledger.get_run(keys[0]).state == "cancelled" and ledger.get_run(keys[0]).cause == "not needed"
    assert {ledger.get_run(k).state for k in keys[1:]} == {"held"}


@pytest.mark.postgres
def test_a_member_records_and_reruns_their_canaries_only(pg_url: str) -> None:
    """Row-level security of `canaries` (migration 0013): a member creates the canary of their own
    experiment and queues it again; another member's experiment is not theirs to touch; the service
    books its end."""
    import uuid

    from sqlalchemy import text

    from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
    from ggpo_batch.errors import GgpoError
    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.db import make_engine
    from tests.support.services import wipe_pg

    wipe_pg(pg_url)
    admin = make_engine(pg_url)
    upgrade(admin)
    roles = [f"can_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with admin.begin() as conn:
        for role in roles:
            conn.execute(text(f"CREATE ROLE {role} LOGIN IN ROLE ggpo_member"))
    urls = [pg_url.replace("postgres@", f"{role}@", 1) for role in roles]
    leds = [connect(u, retry_seconds=0) for u in urls]
    try:
        run = RunSpec(run_key="mine-v1-1-clean", experiment="mine", experiment_version=1, method="ggpo",
                      arm=ArmSpec("clean"), seed=1, gpus=4, loop_budget_seconds=1, executor="debug",
                      profile="default", train={})
        exp = leds[0].create_experiment(name="mine", version=1, method="ggpo", source="spec", spec_hash="m", spec={},
                                        gpus=4, actor=roles[0], initial_state="held",
                                        runs=[NewRun(run_key=run.run_key, arm="clean", seed=1, config_hash="c",
                                                     run_spec=run.to_dict())])
        [spec] = canary_specs([run])
        with pytest.raises(Exception, match="row-level security"):  # not theirs (the driver's error)
            leds[1].create_canaries(exp.id, [spec], actor=roles[1])
        assert leds[0].create_canaries(exp.id, [spec], actor=roles[0]) == [spec.key]
        service = connect(pg_url)
        _c, att = service.begin_canary(spec.key, actor="svc", worker="w", executor="debug", gpus=4)
        service.end_canary(spec.key, att.number, attempt_state="failed", canary_state="failed", reason="planted",
                           record=None, actor="svc", gpu_hours_job=0.01)
        service.engine.dispose()
        with pytest.raises(GgpoError):
            leds[1].requeue_canary(spec.key, actor=roles[1], reason="not mine")
        assert leds[0].requeue_canary(spec.key, actor=roles[0], reason="fixed").state == "queued"
        assert leds[1].canaries(exp.id)[0].state == "queued"  # every role reads them
    finally:
        for led in leds:
            led.engine.dispose()
        with admin.begin() as conn:
            for role in roles:
                conn.execute(text(f"DROP OWNED BY {role}"))
                conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
        wipe_pg(pg_url)


def test_a_passing_canary_leaves_a_later_waves_runs_held(ledger, settings, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(CANARY_FAULT_ENV, raising=False)
    text = DEBUG.replace("seeds = [1, 2]", "seeds = [1, 2, 3, 4]") + (
        '[power]\nsigma = 0.1\neffect = 0.05\ndesign = "sequential"\nwaves = [2, 4]\n')
    spec = _spec(tmp_path, text)
    res = enqueue_spec(ledger, settings, spec, actor="tester")
    assert res.enqueued == 0 and len(res.held) == 8 and len(res.canaries) == 1
    assert submit_canary(ledger, settings, res.canaries[0], worker="w-test")["state"] == "passed"
    states_by_seed = {(r.seed, r.state) for r in ledger.runs()}
    assert states_by_seed == {(1, "queued"), (2, "queued"), (3, "held"), (4, "held")}
