"""The RQ paths against the real Redis (the test's own db) and a real SimpleWorker: RQ cron config and the
enqueue_at chain both run the tier once per night and record it in the ledger."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from ggpo_batch.nightly.schedule import enqueue_next_night, next_run_after, nightly_job
from ggpo_batch.nightly.suite import load_suite
from tests.support.paths import REPO

pytestmark = pytest.mark.redis


@pytest.fixture
def worker_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The settings a worker reads: a fresh SQLite ledger at head, a private data dir."""
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    for k, v in {"GGPO_DB_URL": url, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester"}.items():
        monkeypatch.setenv(k, v)
    led = connect(url)
    yield led
    led.engine.dispose()


def _burst(conn, queue_name: str, with_scheduler: bool = False) -> None:
    from rq import Queue, SimpleWorker

    SimpleWorker([Queue(queue_name, connection=conn)], connection=conn).work(burst=True,
                                                                             with_scheduler=with_scheduler)


def test_rq_cron_config_registers_and_its_job_runs_once_a_night(redis_conn, worker_env, tiny_suite_path: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from rq import Queue
    from rq.cron import CronScheduler

    monkeypatch.setenv("GGPO_NIGHTLY_SUITE", str(tiny_suite_path))
    monkeypatch.setenv("GGPO_NIGHTLY_OUTPUT", str(tmp_path / "nightly"))
    scheduler = CronScheduler(connection=redis_conn)
    scheduler.load_config_from_file(str(REPO / "tools" / "nightly" / "rq_cron.py"))
    [cron_job] = scheduler.get_jobs()
    assert (cron_job.cron, cron_job.queue_name) == ("30 2 * * *", "nightly-test")
    assert cron_job.kwargs == {"suite_path": str(tiny_suite_path), "output_dir": str(tmp_path / "nightly")}
    first = cron_job.enqueue(redis_conn)
    second = cron_job.enqueue(redis_conn)  # a second `rq cron`, or a manual enqueue, the same night
    _burst(redis_conn, "nightly-test")
    q = Queue("nightly-test", connection=redis_conn)
    r1, r2 = (q.fetch_job(j.id).return_value() for j in (first, second))
    assert [d["ran"] for d in r1 + r2] == [True, False]
    [row] = worker_env.component_runs()
    assert row.state == "succeeded" and row.actor == f"tester (rq:{first.id})"
    assert Path(r1[0]["artifact"]).exists() and r2[0]["claimed_by"] == f"tester (rq:{first.id}) (succeeded)"
    assert row.record["provenance"]["command"].startswith(f"rq-job {first.id} ")


@pytest.mark.slow
def test_enqueue_at_chain_runs_a_due_night_and_schedules_the_next(redis_conn, worker_env, tiny_suite_path: Path,
                                                                 tmp_path: Path):
    from rq import Queue
    from rq.registry import ScheduledJobRegistry

    suite = load_suite(tiny_suite_path)
    past = datetime(2026, 11, 20, 0, 0, tzinfo=timezone.utc)
    job = enqueue_next_night(redis_conn, suite, tmp_path / "nightly", now=past)
    again = enqueue_next_night(redis_conn, suite, tmp_path / "nightly", now=past)
    registry = ScheduledJobRegistry("nightly-test", connection=redis_conn)
    assert job.id == again.id == "ggpo-nightly-nightly-test-2026-11-20" and registry.get_job_ids() == [job.id]
    assert registry.get_scheduled_time(job.id) == datetime(2026, 11, 20, 2, 30, tzinfo=timezone.utc)

    _burst(redis_conn, "nightly-test", with_scheduler=True)  # enqueues the due job, then runs it
    [result] = Queue("nightly-test", connection=redis_conn).fetch_job(job.id).return_value()
    assert result["ran"] and result["night"] == "2026-11-20"
    assert [r.night for r in worker_env.component_runs()] == ["2026-11-20"]
    following = next_run_after(suite.schedule.cron, datetime.now(timezone.utc))
    assert registry.get_job_ids() == [f"ggpo-nightly-nightly-test-{following.date().isoformat()}"]


def test_nightly_job_outside_rq_is_refused(tiny_suite_path: Path, tmp_path: Path):
    with pytest.raises(RuntimeError, match="inside an RQ job"):
        nightly_job(str(tiny_suite_path), str(tmp_path))
