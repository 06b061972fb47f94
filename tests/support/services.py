"""The real Redis and PostgreSQL the tests use, kept apart per pytest-xdist worker.

Each xdist worker (gw0, gw1, ...) flushes only its own Redis db: GGPO_TEST_REDIS_DB (default 1)
plus the worker's number, so a run with `-n 2` uses dbs 1 and 2, and a second run started with
GGPO_TEST_REDIS_DB=5 uses 5 and 6. PostgreSQL databases are per session (hence per worker):
see the `pg_url` fixture in tests/conftest.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

REDIS_URL = os.environ.get("GGPO_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REDIS_BASE_DB = int(os.environ.get("GGPO_TEST_REDIS_DB", "1"))
PG_ADMIN_URL = os.environ.get("GGPO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def xdist_worker_number() -> int:
    """0 for gw0 (and without xdist), 1 for gw1, ..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def redis_test_db() -> int:
    """The Redis db this process's tests may flush."""
    return REDIS_BASE_DB + xdist_worker_number()


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
    except redis.exceptions.ResponseError as exc:  # "DB index is out of range"
        pytest.fail(f"Redis db {db} (GGPO_TEST_REDIS_DB {REDIS_BASE_DB} + xdist worker "
                    f"{xdist_worker_number()}) is not usable: {exc}")
    conn.flushdb()
    yield url
    conn.flushdb()
    conn.close()


def pg_problem() -> str | None:
    """Why the shared PostgreSQL cannot be used, or None."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001  (any failure means: not usable here)
        return f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}"


def wipe_pg(url: str) -> None:
    """Drop every table of the database at `url` (an empty public schema, as after CREATE DATABASE)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()
