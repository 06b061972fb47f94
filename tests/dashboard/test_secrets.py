"""No page and no API response shows a secret: the ledger URL's password (a PostgreSQL ledger
reached with one), the Redis URL's, or the dashboard's token, even where the ledger and a job's log
quote them. The text around them is shown, the secret replaced by ***."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder
from tests.dashboard.conftest import Browsed
from tests.dashboard.server import Dashboard, cli_env, get, ggpo
from tests.support.services import REDIS_URL, wipe_pg

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]  # 10 s and more

PG_PASSWORD = "Pg-Secret-9f3kQ"
REDIS_PASSWORD = "Redis-Secret-77xZ"
TOKEN = "dash-Token-Secret-0123456789"
SECRETS = (PG_PASSWORD, REDIS_PASSWORD, TOKEN)

SPEC = """
schema = 1
[experiment]
name = "leaky"
method = "ggpo"
seeds = [1]
gpus = 4
loop_budget_seconds = 5
executor = "local"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


@pytest.fixture
def leaky(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[tuple[Dashboard, str]]:
    """A PostgreSQL ledger reached with a password (the server trusts local connections, so any password
    works), a run cancelled with a cause quoting the ledger URL and the token, and its job's log quoting
    the Redis URL with its password and the token. The dashboard serves it with a token and a Redis URL
    carrying a password."""
    from ggpo_batch.ledger import connect

    wipe_pg(pg_url)
    db_url = pg_url.replace("postgres@", f"postgres:{PG_PASSWORD}@", 1)
    assert PG_PASSWORD in db_url
    env = cli_env(GGPO_DB_URL=db_url, GGPO_REDIS_URL=redis_url, GGPO_DATA_DIR=str(tmp_path / "data"),
                  GGPO_USER="tester", GGPO_QUEUE="dashq")
    spec = tmp_path / "leaky.toml"
    spec.write_text(SPEC)
    for args in (["db", "upgrade"], ["enqueue", str(spec)]):
        done = ggpo(env, *args)
        assert done.returncode == 0, done.stderr
    key = "leaky-v1-1-clean"
    led = connect(db_url)
    led.begin_attempt(key, executor="local", gpus=4, actor="tester", worker="w1")
    led.mark_submitted(key, 1, job_id="4242", actor="tester")
    folder = attempt_folder(tmp_path / "data" / "jobs", key, 1)
    folder.mkdir(parents=True)
    redis_with_password = redis_url.replace("redis://", f"redis://:{REDIS_PASSWORD}@", 1)
    (folder / "4242_0_log.out").write_text(f"step 1\nconnecting to {redis_with_password}\nbare {REDIS_PASSWORD} "
                                           f"and {TOKEN}\nstep 2\n")
    (folder / "4242_0_log.err").write_text(f"warning: {PG_PASSWORD}\n")
    led.mark_cancelled(key, actor="tester", reason=f"ledger lost: {db_url} (token {TOKEN})")
    led.engine.dispose()
    dash = Dashboard({**env, "GGPO_DASHBOARD_TOKEN": TOKEN, "GGPO_REDIS_URL": redis_with_password},
                     tmp_path / "dashboard.log")
    yield dash, key
    dash.stop()
    wipe_pg(pg_url)


ROUTES = ["/", "/fragments/index", "/experiments/leaky", "/fragments/experiments/leaky/runs",
          "/fragments/experiments/leaky/results", "/runs/{key}", "/fragments/runs/{key}", "/nightly",
          "/api/status", "/api/status?runs=1", "/api/experiments/leaky", "/api/runs/{key}", "/api/components"]


def test_no_route_shows_a_secret_but_the_text_around_it_is_shown(leaky: tuple[Dashboard, str]) -> None:
    dash, key = leaky
    bodies = {}
    for route in ROUTES:
        code, body = get(dash.url + route.format(key=key), {"Authorization": f"Bearer {TOKEN}"})
        assert code == 200, (route, body[:300])
        bodies[route] = body
        for secret in SECRETS:
            assert secret not in body, (route, secret)
    run_page = bodies["/runs/{key}"]
    assert "ledger lost: postgresql+psycopg://postgres:***@127.0.0.1:5432/" in run_page  # cause and event reason
    redis_host = REDIS_URL.split("://", 1)[1].rstrip("/")  # the test Redis (GGPO_TEST_REDIS_URL)
    assert f"connecting to redis://:***@{redis_host}/" in run_page and "bare *** and ***" in run_page  # the log
    assert "warning: ***" in run_page
    assert "(token ***)" in bodies["/api/runs/{key}"] and "(token ***)" in bodies["/api/status?runs=1"]


def test_the_browser_shows_no_secret_either(leaky: tuple[Dashboard, str], browsed: Browsed) -> None:
    dash, key = leaky
    page = browsed.page
    page.goto(f"{dash.url}/runs/{key}?token={TOKEN}")
    page.wait_for_selector("details.log")
    page.wait_for_timeout(2500)  # one refresh of the live part
    html = page.content()
    assert "bare *** and ***" in html
    for secret in SECRETS:
        assert secret not in html and secret not in page.url
    assert browsed.errors == []
