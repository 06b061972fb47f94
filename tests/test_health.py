"""`/healthz` (issue 41) on the dashboard and on a worker's metrics port, over real HTTP, against a
PostgreSQL and a Redis this test starts and stops itself (never the shared ones): 200 while both
answer, 503 naming what failed once one stops; open without the dashboard's token, its body naming
no secret. `/metrics` stays behind the token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ggpo_batch.common.netutil import free_port
from tests.dashboard.server import Dashboard, cli_env, get, ggpo
from tests.support.paths import REPO
from tests.support.waiting import wait_until

PASSWORD = "pg-Secret-4471"
TOKEN = "health-token-0123456789abcdef"

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


class PrivateRedis:
    """redis-server on a free loopback port, no persistence, until stopped."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        def answers() -> bool:
            try:
                return bool(redis.Redis(port=self.port).ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_until(answers, 20, "the private redis-server answering", interval=0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)


@pytest.fixture
def services() -> Iterator[tuple[object, PrivateRedis]]:
    from tests.faults.pgcluster import PrivateCluster

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (tools/services.sh installs it)")
    pg = PrivateCluster(free_port(), password=PASSWORD)
    pg.start()
    redis = PrivateRedis()
    try:
        yield pg, redis
    finally:
        redis.stop()
        pg.destroy()


def _health(url: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    status, body = get(url + "/healthz")
    assert PASSWORD not in body and TOKEN not in body and "127.0.0.1" not in body, body
    return status, json.loads(body)


def test_healthz_200_then_503_naming_what_failed(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pg, redis = services
    env = cli_env(GGPO_DB_URL=pg.url, GGPO_REDIS_URL=redis.url, GGPO_DATA_DIR=str(tmp_path / "data"),
                  GGPO_USER="tester", GGPO_QUEUE="hq", GGPO_DASHBOARD_TOKEN=TOKEN)
    done = ggpo(env, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    dashboard = Dashboard(env, tmp_path / "dashboard.log")
    port = free_port()
    with open(tmp_path / "worker.log", "wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "worker", "--metrics-port", str(port)],
                                  env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    worker_url = f"http://127.0.0.1:{port}"
    try:
        def worker_answers() -> bool:
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-2000:]
            try:
                return get(worker_url + "/healthz")[0] == 200
            except OSError:
                return False

        wait_until(worker_answers, 60, "the worker's /healthz")
        for url in (dashboard.url, worker_url):
            status, doc = _health(url)
            assert (status, doc["status"], doc["failed"]) == (200, "ok", []), doc
            assert doc["checks"]["ledger"]["revision"] == doc["checks"]["ledger"]["head"]
        # /metrics keeps the token; /healthz is open without it
        assert get(dashboard.url + "/metrics")[0] == 401
        status, body = get(dashboard.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        from prometheus_client.parser import text_string_to_metric_families

        got = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        assert got["ggpo_ledger_up"] == 1 and got["ggpo_outbox_pending"] == 0

        pg.stop()  # the ledger goes away: both answer 503, naming the ledger
        for url in (dashboard.url, worker_url):
            status, doc = _health(url)
            assert (status, doc["status"], doc["failed"]) == (503, "failing", ["ledger"]), doc
            assert doc["checks"]["ledger"]["reachable"] is False

        t0 = time.monotonic()
        status, body = get(dashboard.url + "/metrics", {"Authorization": f"Bearer {TOKEN}"})
        from ggpo_batch.dashboard.routes import LEDGER_RETRY_SECONDS

        assert status == 200 and time.monotonic() - t0 < LEDGER_RETRY_SECONDS, "a scrape does not wait for the ledger"
        got = {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples}
        assert got.pop("ggpo_ledger_up") == 0 and set(got) <= {"ggpo_last_reconcile_age_seconds"}, got  # from Redis

        redis.stop()  # and Redis too
        status, doc = _health(dashboard.url)
        assert (status, doc["failed"]) == (503, ["ledger", "redis"]), doc
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        dashboard.stop()


def test_healthz_names_a_ledger_behind_head(services, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Reachable but not at the head revision: 503, with the revision it is at."""
    from ggpo_batch.control.health import check
    from ggpo_batch.ledger import downgrade, upgrade
    from ggpo_batch.ledger.db import make_engine

    pg, redis = services
    engine = make_engine(pg.url)
    try:
        upgrade(engine)
        assert check(engine, redis.url).status_code == 200
        downgrade(engine, "0009")
        health = check(engine, redis.url)
        t0 = time.monotonic()
        redis.stop()
        down = check(engine, redis.url)
        assert time.monotonic() - t0 < 10  # bounded: a probe never hangs
    finally:
        engine.dispose()
    assert health.status_code == 503 and health.document()["failed"] == ["ledger"]
    assert health.checks["ledger"]["revision"] == "0009" and health.checks["ledger"]["reachable"] is True
    assert down.document()["failed"] == ["ledger", "redis"]
