"""Fixtures of the nightly-tier tests: a tiny suite spec and the real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.specs import write_suite


@pytest.fixture
def tiny_suite_path(tmp_path: Path) -> Path:
    return write_suite(tmp_path)


@pytest.fixture
def redis_conn(redis_url: str):
    """A connection to the root conftest's Redis db (this xdist worker's, flushed around the test)."""
    redis = pytest.importorskip("redis")
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


@pytest.fixture
def nightly_db_url(db_url: str) -> str:
    """The root conftest's empty database, on SQLite and on PostgreSQL."""
    return db_url


@pytest.fixture
def nightly_ledger(ledger):  # type: ignore[no-untyped-def]
    """The root conftest's ledger at head, on SQLite and on PostgreSQL."""
    return ledger
