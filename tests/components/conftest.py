"""Fixtures of the nightly-tier tests: a tiny suite spec and the real Redis (db 12, flushed around each test)."""

from __future__ import annotations

from pathlib import Path

import pytest

REDIS_URL = "redis://127.0.0.1:6379/12"

TINY_SUITE = """
schema = 1
[suite]
name = "nightly-test"
tier = "l1_mechanism"
methods = ["ggpo"]
seeds = {seeds}
time_goal_seconds = 60
[model]
width = 24
[budgets]
teacher_steps = 3
specialist_steps = 2
student_steps = 2
max_new_tokens = 8
batch_size = 8
window_bytes = 32
prompt_bytes = 8
eval_chunk_bytes = 64
[ggpo]
group_size = 4
reference_refresh_steps = 2
max_group_draws_per_step = 4
[corpus]
id = "test:absent"
path = "{absent}"
max_bytes = 100000
generated_bytes = 20000
[schedule]
cron = "30 2 * * *"
queue = "nightly-test"
[full_experiment]
status = "not_reproduced_high_cost"
review_done = true
resolution = "r"
available_budget = "b"
cost_basis = "c"
cost_type = "t"
automatic_retry = false
"""


def write_suite(tmp_path: Path, seeds: str = "[1, 2]") -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(TINY_SUITE.format(seeds=seeds, absent=tmp_path / "absent.txt"))
    return path


@pytest.fixture
def tiny_suite_path(tmp_path: Path) -> Path:
    return write_suite(tmp_path)


@pytest.fixture
def redis_conn():
    redis = pytest.importorskip("redis")
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        conn.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("Redis on 127.0.0.1:6379 is not running")
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture(scope="session")
def nightly_pg_url():
    """A PostgreSQL database of this task's own (ggpo_nightly_*), dropped at the end of the session."""
    import os
    import uuid

    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    name = f"ggpo_nightly_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def nightly_db_url(request, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        return
    url = request.getfixturevalue("nightly_pg_url")
    from sqlalchemy import create_engine, text

    def wipe() -> None:
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()

    wipe()
    yield url
    wipe()


@pytest.fixture
def nightly_ledger(nightly_db_url: str):
    """The lead's ledger at head on SQLite and on PostgreSQL."""
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    engine = make_engine(nightly_db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(nightly_db_url)
    yield led
    led.engine.dispose()
