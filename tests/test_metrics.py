"""Metrics (issue 41): the dashboard's ledger figures, a process's own counters (what a forked
process counts included), and a real worker's metrics port, each parsed with prometheus_client's
own text parser."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ggpo_batch.common.netutil import free_port
from tests.dashboard.server import get
from tests.support.paths import REPO
from tests.support.waiting import wait_until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by (name, sorted labels), through prometheus_client's parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _fill(ledger: Any) -> None:
    """Queue q1: 3 runs (1 running with its attempt, 2 queued); no queue: 2 runs failed, one attempt
    each, 1.5 GPU-hours booked in all; one notification pending."""
    from ggpo_batch.contracts.notices import Notice
    from ggpo_batch.ledger import NewRun
    from ggpo_batch.ledger.bulk import insert_rows
    from ggpo_batch.ledger.schema import Attempt, Run

    def runs(name: str, n: int) -> list[NewRun]:
        return [NewRun(run_key=f"{name}-v1-{i}-a", arm="a", seed=i, config_hash="c", run_spec={}) for i in range(n)]

    ledger.create_experiment(name="m1", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=runs("m1", 3), queue="q1")
    ledger.create_experiment(name="m2", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=runs("m2", 2), initial_state="failed")
    now = datetime.now(UTC)
    with ledger.session() as s:
        ids = {key: i for i, key in s.query(Run.id, Run.run_key)}
        s.execute(Run.__table__.update().where(Run.__table__.c.run_key == "m1-v1-0-a").values(state="running"))
        cols = ("run_id", "number", "executor", "state", "submitted_by", "gpus", "created_at", "gpu_hours_scheduler")
        insert_rows(s, Attempt.__table__, cols, [(ids["m1-v1-0-a"], 1, "slurm", "running", "t", 4, now, None),
                                                 (ids["m2-v1-0-a"], 1, "slurm", "failed", "t", 4, now, 1.0),
                                                 (ids["m2-v1-1-a"], 1, "slurm", "failed", "t", 4, now, 0.5)])
    ledger.record_notices([Notice("k1", "run_failed", "m2 failed")])


def test_ledger_figures_parse_with_prometheus_parser(ledger) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.reporting.ledger_metrics import LedgerCollector, exposition

    _fill(ledger)
    body, content_type = exposition(LedgerCollector(ledger, default_queue="dflt", last_reconcile=lambda: 0.0))
    assert content_type.startswith("text/plain")
    got = samples(body.decode())
    assert got[("ggpo_ledger_up", ())] == 1
    assert got[("ggpo_runs", (("queue", "q1"), ("state", "queued")))] == 2
    assert got[("ggpo_runs", (("queue", "q1"), ("state", "running")))] == 1
    assert got[("ggpo_runs", (("queue", "q1"), ("state", "lost")))] == 0  # every state, 0 included: delta() works
    assert got[("ggpo_runs", (("queue", "dflt"), ("state", "failed")))] == 2
    assert got[("ggpo_held_runs", (("queue", "q1"),))] == 0
    assert got[("ggpo_active_attempts", (("queue", "q1"),))] == 1
    assert got[("ggpo_active_attempts", (("queue", "dflt"),))] == 0
    assert got[("ggpo_gpu_hours_booked", (("queue", "dflt"),))] == pytest.approx(1.5)
    assert got[("ggpo_outbox_pending", ())] == 1
    assert got[("ggpo_outbox_failed_deliveries", ())] == 0
    assert got[("ggpo_outbox_oldest_pending_age_seconds", ())] >= 0
    assert got[("ggpo_last_reconcile_age_seconds", ())] > 1e9  # at the epoch: decades ago


def test_ledger_down_is_a_gauge_not_an_error(tmp_path: Path) -> None:
    from ggpo_batch.ledger import connect
    from ggpo_batch.reporting.ledger_metrics import LedgerCollector, exposition

    led = connect(f"sqlite:///{tmp_path / 'none.sqlite3'}", check=False, retry_seconds=0)  # no schema: queries fail
    got = samples(exposition(LedgerCollector(led, default_queue="q"))[0].decode())
    led.engine.dispose()
    assert got == {("ggpo_ledger_up", ()): 0}


def _count_in_child() -> str:
    from ggpo_batch.common import metrics

    metrics.count(metrics.LEDGER_RETRIES, 2)
    metrics.observe(metrics.SACCT_SECONDS, 0.25)
    return "counted"


def test_forked_processes_counts_reach_the_process_exposition(tmp_path: Path) -> None:
    from ggpo_batch.common import metrics
    from ggpo_batch.executor.forked import call_forked

    metrics.use_directory(str(tmp_path))
    try:
        metrics.declare_all()
        metrics.count(metrics.LEDGER_RETRIES)
        assert call_forked(_count_in_child, own_group=False) == "counted"
        got = samples(metrics.exposition()[0].decode())
    finally:
        metrics.use_directory(None)
    assert got[("ggpo_ledger_retries_total", ())] == 3  # 1 here + 2 in the forked child
    assert got[("ggpo_sacct_seconds_count", ())] == 1
    assert got[("ggpo_sbatch_pacing_wait_seconds_count", ())] == 0  # declared: shown at 0 before it counts


def test_worker_metrics_port_over_real_http(tmp_path: Path, redis_url: str) -> None:
    """A real `worker --metrics-port`: its reconcile cycles counted, /healthz 200, both parsed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_DB_URL=f"sqlite:///{tmp_path / 'ledger.sqlite3'}", GGPO_REDIS_URL=redis_url,
               GGPO_DATA_DIR=str(tmp_path / "data"), GGPO_USER="tester", GGPO_QUEUE="mq",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cli = [sys.executable, "-m", "ggpo_batch.cli"]
    assert subprocess.run([*cli, "db", "upgrade"], env=env, capture_output=True, timeout=120, check=False).returncode == 0
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*cli, "worker", "--metrics-port", str(port), "--reconcile-interval", "5"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def reconciled() -> dict[Any, float] | None:
            assert proc.poll() is None, log.read_text()[-2000:]
            try:
                status, body = get(f"http://127.0.0.1:{port}/metrics")
            except OSError:
                return None
            got = samples(body) if status == 200 else {}
            return got if got.get(("ggpo_reconcile_seconds_count", ()), 0) >= 1 else None

        got = wait_until(reconciled, 60, "the worker's first reconcile counted on its metrics port")
        assert got[("ggpo_sacct_calls_total", ())] == 0
        assert ("ggpo_ledger_retries_total", ()) in got
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200, body
        assert status == 200 and '"status": "ok"' in body
        assert get(f"http://127.0.0.1:{port}/nothing")[0] == 404
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    assert not list(Path("/tmp").glob(f"ggpo-worker-metrics-*/counter_{proc.pid}.db")), "its folder is removed"
