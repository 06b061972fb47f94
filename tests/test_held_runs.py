"""Held runs (ggpo_batch/control/holds.py): in the ledger, never on the queue, until released
(held -> queued, then on the queue as enqueue puts runs there) or cancelled with a reason; on
SQLite and PostgreSQL, against the real Redis."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts import states
from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.holds import cancel_held, held_run_keys, release
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.errors import LedgerError
from ggpo_batch.spec.parse import load_spec
from tests.support.services import wipe_pg
from tests.test_queue import SPEC

pytestmark = pytest.mark.redis


def _spec(tmp_path: Path):  # type: ignore[no-untyped-def]
    p = tmp_path / "q.toml"
    p.write_text(SPEC)
    return load_spec(p)


def test_the_held_state_moves_only_to_queued_cancelled_or_not_reproduced() -> None:
    assert states.can_move(None, "held")
    assert {d for d in states.RUN_STATES if states.can_move("held", d)} == {"queued", "cancelled", "not_reproduced"}
    # held at creation, or again when the cost of a sequential design's later wave is accepted, or when a
    # failed canary that cancelled the run is re-run (ledger/canaries.py admits only those: tests/test_canary.py)
    assert {s for s in states.RUN_STATES if states.can_move(s, "held")} == {"not_reproduced", "cancelled"}
    assert "held" in states.CANCELLABLE_RUN_STATES and "held" in states.UNFINISHED_RUN_STATES


def test_held_runs_stay_off_the_queue_until_released(ledger, settings, worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    q = RunQueue.from_url(settings.redis_url, "testq")
    res = enqueue_spec(ledger, settings, spec, actor="tester", hold=True)
    keys = sorted(r.run_key for r in spec.expand(1))
    assert res.enqueued == 0 and sorted(res.held) == keys
    assert ledger.run_states(ledger.latest_experiment("q").id) == dict.fromkeys(keys, "held")
    assert q.present() == set()
    # Neither a repeated enqueue nor reconcile puts a held run on the queue.
    again = enqueue_spec(ledger, settings, spec, actor="tester")
    assert again.enqueued == again.restored == 0 and again.new_runs == []
    assert reconcile(ledger, settings, [q], actor="test").requeued == 0
    assert q.present() == set() and sorted(held_run_keys(ledger, "q")) == keys
    # A job of a held run that reached a worker anyway (put there by hand) submits nothing.
    from ggpo_batch.control.worker import submit_run

    assert submit_run(ledger, settings, keys[0], worker="w-test") == {"run_key": keys[0], "skipped": "held"}
    assert ledger.get_run(keys[0]).attempts == []
    # Their estimates count against the caps while held (a release does not check them again).
    assert ledger.committed_gpu_hours(experiment_id=ledger.latest_experiment("q").id)[1] == pytest.approx(4 * 4 * 5 / 3600)
    # status says so, per run and per experiment.
    shown = CliRunner().invoke(cli, ["status", "-e", "q"], env=worker_env, catch_exceptions=False)
    assert "held, not queued until released" in shown.output and "4 run(s) held off the queue" in shown.output
    # Released: held -> queued in the ledger, then on the queue; once.
    out = release(ledger, settings, "q", actor="tester", reason="canary passed", run_keys=keys[:3])
    assert sorted(out.run_keys) == keys[:3] and out.enqueued == 3 and sorted(q.waiting()) == keys[:3]
    assert ledger.get_run(keys[3]).state == "held"
    assert [(e.from_state, e.to_state, e.reason) for e in ledger.events(run_key=keys[0])][-1] == (
        "held", "queued", "canary passed")
    cli_out = CliRunner().invoke(cli, ["release", "q@1"], env=worker_env, catch_exceptions=False)
    assert cli_out.exit_code == 0 and "1 held run(s) released, 1 queued on 'testq'" in cli_out.output
    assert sorted(q.waiting()) == keys and all(r.state == "queued" for r in ledger.runs())
    assert release(ledger, settings, "q", actor="tester").run_keys == []
    assert "no held run" in CliRunner().invoke(cli, ["release", "q"], env=worker_env).output
    with pytest.raises(LedgerError, match="no experiment 'q' version 2"):
        release(ledger, settings, "q", 2, actor="tester")


def test_held_runs_are_cancelled_with_the_reason(ledger, settings, worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    enqueue_spec(ledger, settings, spec, actor="tester", hold=True)
    keys = sorted(r.run_key for r in spec.expand(1))
    done = cancel_held(ledger, settings, "q", actor="canary", reason="canary failed: greedy tokens differ",
                       run_keys=keys[:2])
    assert sorted(done) == keys[:2]
    assert {ledger.get_run(k).cause for k in keys[:2]} == {"canary failed: greedy tokens differ"}
    # The existing cancel command cancels held runs too.
    res = CliRunner().invoke(cli, ["cancel", "--experiment", "q", "--reason", "not needed"], env=worker_env,
                             catch_exceptions=False)
    assert res.output.count("(was held)") == 2
    assert {r.state for r in ledger.runs()} == {"cancelled"}
    assert release(ledger, settings, "q", actor="tester").run_keys == []
    assert RunQueue.from_url(settings.redis_url, "testq").present() == set()
    from ggpo_batch.reporting.report import experiment_report

    assert not any("held" in n for n in experiment_report(ledger, "q")["notes"])


def test_the_report_says_runs_are_held(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.reporting.report import experiment_report

    enqueue_spec(ledger, settings, _spec(tmp_path), actor="tester", hold=True)
    [note] = [n for n in experiment_report(ledger, "q")["notes"] if "held" in n]
    assert note.startswith("4 of 4 runs are held") and "ggpo-batch release q@1" in note


@pytest.mark.postgres
def test_a_member_may_create_held_runs_only_from_migration_0011(pg_url: str) -> None:
    """Row-level security (migration 0006's `runs` insert policy) refused a member's held run;
    0011 admits it. A login role in ggpo_member connects as itself (the shared PostgreSQL trusts it)."""
    from sqlalchemy import text

    from ggpo_batch.ledger import NewRun, connect, downgrade, upgrade
    from ggpo_batch.ledger.db import make_engine

    wipe_pg(pg_url)
    db_url = pg_url
    role = f"held_{uuid.uuid4().hex[:8]}"
    admin = make_engine(db_url)
    upgrade(admin, "0010")
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN IN ROLE ggpo_member"))
    member_url = db_url.replace("postgres@", f"{role}@", 1)
    try:
        def create(name: str):  # type: ignore[no-untyped-def]
            led = connect(member_url, check=False, retry_seconds=0)
            try:
                return led.create_experiment(
                    name=name, version=1, method="ggpo", source="spec", spec_hash="h" + name, spec={}, gpus=1,
                    actor=role, initial_state="held",
                    runs=[NewRun(run_key=f"{name}-v1-1-clean", arm="clean", seed=1, config_hash="c", run_spec={})])
            finally:
                led.engine.dispose()

        with pytest.raises(Exception, match="row-level security"):  # the driver's error, from the bulk insert
            create("before")
        upgrade(admin)
        create("after")
        with admin.connect() as conn:
            assert conn.execute(text("SELECT run_key, state FROM runs")).all() == [("after-v1-1-clean", "held")]
        downgrade(admin, "0010")
        with pytest.raises(Exception, match="row-level security"):
            create("again")
        upgrade(admin)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()
        wipe_pg(pg_url)
