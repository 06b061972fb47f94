"""Fixtures that start or reuse the real services: PostgreSQL on 127.0.0.1:5432, Redis on 6379.

Every ledger test runs on SQLite and on PostgreSQL. PostgreSQL tests get a database of their own
per session (created and dropped here) and empty tables per test.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
SEEDS = Path(os.environ.get("GGPO_SEEDS_DIR", REPO.parent / "shared" / "seeds"))
SEED_000 = SEEDS / "000_b2e3fe1f0148d43c.txt"
SEED_003 = SEEDS / "003_6402ffbf4ba21fea.txt"
PG_ADMIN_URL = os.environ.get("GGPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("GGPO_TEST_REDIS_URL", "redis://127.0.0.1:6379")


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), connect_timeout=3):
            return None
    except Exception as exc:  # pragma: no cover - depends on the machine
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    problem = _pg_available()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    import psycopg

    name = f"ggpo_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = PG_ADMIN_URL.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        return
    url = request.getfixturevalue("pg_url")
    _wipe_pg(url)
    yield url
    _wipe_pg(url)


def _wipe_pg(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture
def ledger(db_url: str):  # type: ignore[no-untyped-def]
    """A ledger at the head revision on SQLite and on PostgreSQL."""
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    yield led
    led.engine.dispose()


@pytest.fixture
def env(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for CLI tests: the test database, a private data dir, a fixed user."""
    values = {"GGPO_DB_URL": db_url, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester"}
    for k in list(os.environ):
        if k.startswith("GGPO_") and k not in values:
            monkeypatch.delenv(k)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


# Redis db numbers this suite may flush (other suites on the machine use 8 and up).
REDIS_TEST_DB = int(os.environ.get("GGPO_TEST_REDIS_DB", "1"))


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The real Redis, one database of its own, flushed before and after the test."""
    yield from flushed_redis(REDIS_TEST_DB)


def flushed_redis(db: int) -> Iterator[str]:
    """Yield the URL of Redis database `db`, flushed before and after (skip, or fail in CI, if down)."""
    import redis

    url = f"{REDIS_URL}/{db}"
    conn = redis.Redis.from_url(url)
    try:
        conn.ping()
    except redis.exceptions.ConnectionError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Redis not reachable at {url}: {exc}")
        pytest.skip(f"Redis not reachable at {url}: {exc}")
    conn.flushdb()
    yield url
    conn.flushdb()
    conn.close()


@pytest.fixture
def settings(tmp_path: Path, db_url: str, redis_url: str, ledger):  # type: ignore[no-untyped-def]
    """Settings on the test ledger and Redis db, with a private data dir."""
    from ggpo_batch.config import load_settings

    return load_settings({"GGPO_DB_URL": db_url, "GGPO_REDIS_URL": redis_url, "GGPO_DATA_DIR": str(tmp_path / "data"),
                          "GGPO_USER": "tester", "GGPO_QUEUE": "testq", "GGPO_DEFER_SECONDS": "1"})


@pytest.fixture
def worker_env(settings, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The environment an RQ worker (and its jobs) read their settings from."""
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    values = {"GGPO_DB_URL": settings.db_url, "GGPO_REDIS_URL": settings.redis_url,
              "GGPO_DATA_DIR": str(settings.data_dir), "GGPO_USER": "tester", "GGPO_QUEUE": "testq",
              "GGPO_DEFER_SECONDS": "1"}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values
