"""`status`: totals in SQL, the runs that need a look first and a page at most, Redis asked only
about shown queued runs, `--json` streamed — on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common.schemas import SCHEMAS
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger import db as ledger_db
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.status import experiment_status

RUNS = 60


def _fill(db_url: str) -> list[str]:
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    keys = [f"sv-v1-{i}-{'a' if i % 2 else 'b'}" for i in range(RUNS)]
    led.create_experiment(name="sv", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="t", queue="svq", runs=[NewRun(run_key=k, arm=k[-1], seed=i, config_hash="c",
                                                               run_spec={}, estimated_gpu_hours=0.5)
                                                        for i, k in enumerate(keys)])
    # One run failed before any scheduler had it (0 GPU-h), one is running: both need a look.
    led.begin_attempt(keys[41], executor="debug", gpus=4, actor="t", worker="w")
    led.resolve_submitting(keys[41], 1, job_id=None, actor="t", reason="refused", state="failed")
    led.begin_attempt(keys[7], executor="debug", gpus=4, actor="t", worker="w")
    led.mark_submitted(keys[7], 1, job_id="j7", actor="t")
    led.engine.dispose()
    return keys


def _cli(*args: str) -> object:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_default_view_totals_all_runs_and_lists_a_page_worst_first(env: dict[str, str], db_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  redis_url: str) -> None:
    keys = _fill(db_url)
    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    q = RunQueue.from_url(redis_url, "svq")
    q.enqueue(keys[:5])
    out = json.loads(_cli("status", "--json").output)
    [exp] = out["experiments"]
    assert exp["totals"]["runs"] == RUNS and exp["totals"]["states"] == {"failed": 1, "queued": RUNS - 2,
                                                                         "submitted": 1}
    assert exp["arms"]["a"]["runs"] == exp["arms"]["b"]["runs"] == RUNS // 2
    assert exp["estimated_gpu_hours"] == pytest.approx(RUNS * 0.5)
    rows = exp["runs"]
    assert len(rows) == 20 and exp["runs_not_shown"] == RUNS - 20
    assert [r["state"] for r in rows[:2]] == ["failed", "submitted"]  # what went wrong, then in flight
    assert rows[2]["run_key"] == keys[0] and rows[2]["queue_position"] == 1 and rows[3]["queue_position"] == 2
    assert all(r["state"] == "queued" for r in rows[2:])
    assert "queue_position" not in {k for r in rows[7:] for k in r}  # not on Redis: no position
    every = json.loads(_cli("status", "--json", "--runs", "--limit", "0").output)["experiments"][0]
    assert len(every["runs"]) == RUNS and every["runs_not_shown"] == 0
    table = _cli("status")
    assert "40 more runs needing a look not listed" in table.output and "58 queued" in table.output


def test_a_filter_without_queued_runs_leaves_redis_alone(env: dict[str, str], db_url: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(db_url)
    monkeypatch.setenv("GGPO_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    res = CliRunner().invoke(cli, ["status", "--json", "-s", "failed"], catch_exceptions=False)
    assert res.exit_code == 0 and "warning" not in res.output
    [exp] = json.loads(res.output)["experiments"]
    assert [r["state"] for r in exp["runs"]] == ["failed"] and exp["totals"]["runs"] == 1
    shown = CliRunner().invoke(cli, ["status"], catch_exceptions=False)  # shows queued runs: asks Redis
    assert shown.exit_code == 0 and "queue positions unavailable" in shown.output


def test_library_view_lists_every_run_by_default(db_url: str) -> None:
    _fill(db_url)
    led = connect(db_url)
    [exp] = experiment_status(led)
    assert len(exp["runs"]) == RUNS and exp["view"] == "runs"
    [att] = experiment_status(led, attention=True, limit=3)
    assert [r["state"] for r in att["runs"]] == ["failed", "submitted", "queued"] and att["runs_not_shown"] == RUNS - 3
    led.engine.dispose()


def _upgraded(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()


STATUS_VIEWS = ([], ["-e", "sv"], ["-s", "failed"], ["--runs", "--limit", "0"])


def test_an_empty_ledger_is_answered_by_one_query_as_the_full_view_answers_it(env: dict[str, str], db_url: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """No experiment and no decision: `status` answers from `ledger.db.is_empty` (no ORM), printing
    exactly what the full view prints, for every view and as JSON; Redis is not asked."""
    _upgraded(db_url)
    monkeypatch.setenv("GGPO_REDIS_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    quick = {(*json_, *view): _cli("status", *json_, *view).output for view in STATUS_VIEWS for json_ in ([], ["--json"])}
    assert quick[()] == "no experiments in the ledger (ggpo-batch enqueue SPEC, or ggpo-batch ledger import FILE)\n"
    assert json.loads(quick[("--json",)]) == {"schema": SCHEMAS["status"].number, "experiments": [], "decided": []}
    monkeypatch.setattr(ledger_db, "is_empty", lambda engine: False)  # the full view, through the ORM
    full = {(*json_, *view): _cli("status", *json_, *view).output for view in STATUS_VIEWS for json_ in ([], ["--json"])}
    assert quick == full


def test_a_ledger_with_only_a_decision_or_an_experiment_without_runs_is_not_empty(env: dict[str, str],
                                                                                 db_url: str) -> None:
    _upgraded(db_url)
    led = connect(db_url)
    assert ledger_db.is_empty(led.engine)
    led.record_decision(experiment_name="paper-full", kind="not_reproduced_high_cost", actor="t", reason="review")
    assert not ledger_db.is_empty(led.engine)
    assert "decided, never queued" in _cli("status").output
    assert [d["experiment"] for d in json.loads(_cli("status", "--json").output)["decided"]] == ["paper-full"]
    with led.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM decisions")
    assert ledger_db.is_empty(led.engine)
    led.create_experiment(name="sv", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="t", queue="svq", runs=[])
    assert not ledger_db.is_empty(led.engine)
    [exp] = json.loads(_cli("status", "--json").output)["experiments"]
    assert exp["experiment"] == "sv" and exp["totals"]["runs"] == 0
    led.engine.dispose()
