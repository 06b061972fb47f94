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


@pytest.fixture
def nightly_db_url(db_url: str) -> str:
    """The root conftest's empty database, on SQLite and on PostgreSQL."""
    return db_url


@pytest.fixture
def nightly_ledger(ledger):  # type: ignore[no-untyped-def]
    """The root conftest's ledger at head, on SQLite and on PostgreSQL."""
    return ledger
