"""`ggpo-batch costs`: GPU-hours booked, attempts and GPU-hours decided not spent, by user,
experiment, queue and month, from one query, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import event

from ggpo_batch.cli import cli
from ggpo_batch.control.importer import import_results
from ggpo_batch.ledger import NewRun
from ggpo_batch.reporting.spending import cost_view
from tests.support.paths import SEED_000

SEED_GPU_HOURS = 57.2974  # seeds/000: 15 succeeded runs
LONG_AGO = datetime.now(UTC) - timedelta(days=62)


def _runs(name: str, n: int, estimate: float | None = None) -> list[NewRun]:
    return [NewRun(run_key=f"{name}-v1-{i}-clean", arm="clean", seed=i, config_hash="h", run_spec={},
                   estimated_gpu_hours=estimate) for i in range(1, n + 1)]


def _fill(ledger) -> None:  # type: ignore[no-untyped-def]
    """alice imported seeds/000 today; bob ran three attempts (one that ended two months ago, booked
    by the scheduler; one today, by its job alone; one still running) and was refused a costly
    experiment (its two runs decided not reproduced, 3 GPU-h each); carol decided against a paper's
    setup before anything was enqueued (5,000 GPU-h)."""
    import_results(ledger, SEED_000, actor="alice", name="imported")
    ledger.create_experiment(name="bobs", version=1, method="ggpo", source="spec", spec_hash="b", spec={}, gpus=4,
                             actor="bob", runs=_runs("bobs", 3), queue="fast")
    for number, key in enumerate(("bobs-v1-1-clean", "bobs-v1-2-clean", "bobs-v1-3-clean"), start=1):
        ledger.begin_attempt(key, executor="slurm", gpus=4, actor="worker", worker="w")
        ledger.mark_submitted(key, 1, job_id=str(number), actor="worker")
    ledger.mark_finished("bobs-v1-1-clean", 1, attempt_state="succeeded", run_state="succeeded", actor="worker",
                         gpu_hours_job=1.9, gpu_hours_scheduler=2.0, elapsed_seconds=1800.0, ended_at=LONG_AGO)
    ledger.mark_finished("bobs-v1-2-clean", 1, attempt_state="failed", run_state="failed", actor="worker",
                         reason="boom", gpu_hours_job=0.5, elapsed_seconds=450.0)
    ledger.apply_decision(experiment_name="costly", kind="not_reproduced_high_cost", actor="bob",
                          fields={"reason": "over the cap"}, new_runs=_runs("costly", 2, 3.0),
                          new_experiment={"name": "costly", "version": 1, "method": "ggpo", "source": "spec",
                                          "spec_hash": "c", "spec": {}, "gpus": 4, "queue": "fast"})
    ledger.apply_decision(experiment_name="paper-full", kind="not_reproduced_high_cost", actor="carol",
                          fields={"reason": "64 GPUs for a week", "estimated_gpu_hours": 5000.0})


def _table(view: dict) -> dict:  # type: ignore[type-arg]
    return {r["key"]: (round(r["gpu_hours"], 4), r["attempts"], r["decided_not_spent_gpu_hours"])
            for r in view["rows"]}


def test_costs_by_each_group_from_one_query(ledger) -> None:  # type: ignore[no-untyped-def]
    _fill(ledger)
    statements: list[str] = []
    event.listen(ledger.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    by_user = cost_view(ledger, by="user", default_queue="ggpo")
    [query] = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert query.count("UNION ALL") == 2
    assert _table(by_user) == {"alice": (SEED_GPU_HOURS, 15, 0.0), "bob": (2.5, 3, 6.0), "carol": (0.0, 0, 5000.0)}
    assert by_user["totals"] == {"gpu_hours": pytest.approx(SEED_GPU_HOURS + 2.5), "attempts": 18,
                                 "decided_not_spent_gpu_hours": 5006.0}
    assert _table(cost_view(ledger, by="experiment", default_queue="ggpo")) == {
        "bobs": (2.5, 3, 0.0), "costly": (0.0, 0, 6.0), "imported": (SEED_GPU_HOURS, 15, 0.0),
        "paper-full": (0.0, 0, 5000.0)}
    assert _table(cost_view(ledger, by="queue", default_queue="ggpo")) == {
        "fast": (2.5, 3, 6.0), "ggpo": (SEED_GPU_HOURS, 15, 0.0), None: (0.0, 0, 5000.0)}
    assert _table(cost_view(ledger, by="month", default_queue="ggpo")) == {
        LONG_AGO.strftime("%Y-%m"): (2.0, 1, 0.0),
        datetime.now(UTC).strftime("%Y-%m"): (round(SEED_GPU_HOURS + 0.5, 4), 17, 5006.0)}
    today = datetime.now(UTC).date()
    since = cost_view(ledger, by="user", since=today, default_queue="ggpo")
    assert since["since"] == today.isoformat()
    assert _table(since) == {"alice": (SEED_GPU_HOURS, 15, 0.0), "bob": (0.5, 2, 6.0), "carol": (0.0, 0, 5000.0)}
    assert cost_view(ledger, by="user", since=today + timedelta(days=1), default_queue="ggpo")["rows"] == []


def test_costs_command_prints_the_table_and_its_json(ledger, env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _fill(ledger)
    runner = CliRunner()
    done = runner.invoke(cli, ["costs", "--by", "user", "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["schema"] == 1 and doc["by"] == "user" and doc["since"] is None
    assert doc == {"schema": 1, **cost_view(ledger, by="user", default_queue="ggpo")}
    done = runner.invoke(cli, ["costs", "--by", "experiment", "--since", datetime.now(UTC).date().isoformat()],
                         catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert "costs by experiment since" in done.output and "bobs" in done.output and "total" in done.output
    done = runner.invoke(cli, ["costs", "--by", "month", "--since", datetime.now(UTC).date().isoformat(), "--json"],
                         catch_exceptions=False)
    assert LONG_AGO.strftime("%Y-%m") not in {r["key"] for r in json.loads(done.output)["rows"]}
    for bad, words in ((["--by", "arm"], "'arm' is not one of"), (["--since", "2026-13-01"], "--since")):
        done = runner.invoke(cli, ["costs", *bad])
        assert done.exit_code == 2 and words in done.output and len(done.output.strip().splitlines()) == 1, done.output
