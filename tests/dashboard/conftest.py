"""The dashboard's fixtures: a real headless Chromium (Debian's, driven by Playwright; nothing is
downloaded), a SQLite ledger at head, this worker's Redis db, and a page that records console errors."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.server import cli_env, ggpo


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's chromium (tools/services.sh installs it), launched headless once per session."""
    path = shutil.which("chromium")
    if path is None:
        message = "Debian's chromium is not installed (tools/services.sh installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=path, headless=True)
        yield browser
        browser.close()


class Browsed:
    """A page and the errors it reported: console messages of type error, uncaught exceptions."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda msg: self.errors.append(f"console: {msg.text} ({msg.location})")
                if msg.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))


@pytest.fixture
def browsed(chromium: Any) -> Iterator[Browsed]:
    """A fresh browser context (no cookies) and page."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    yield Browsed(context.new_page())
    context.close()


def ledger_env(folder: Path, redis_url: str) -> dict[str, str]:
    """The environment of `ggpo-batch` subprocesses: a SQLite ledger at head in `folder`, the Redis db
    `redis_url`, a private data dir and queue."""
    env = cli_env(GGPO_DB_URL=f"sqlite:///{folder / 'ledger.sqlite3'}", GGPO_REDIS_URL=redis_url,
                  GGPO_DATA_DIR=str(folder / "data"), GGPO_USER="tester", GGPO_QUEUE="dashq",
                  GGPO_DEFER_SECONDS="1")
    done = ggpo(env, "db", "upgrade")
    assert done.returncode == 0, done.stderr
    return env


@pytest.fixture
def cli(tmp_path: Path, redis_url: str) -> dict[str, str]:
    """`ledger_env` of this test: its own ledger, this worker's Redis db flushed around it."""
    return ledger_env(tmp_path, redis_url)


@pytest.fixture(scope="module")
def module_cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """`ledger_env` shared by a module's tests (they only read it), Redis flushed around the module."""
    from tests.support.services import flushed_redis, redis_test_db

    for url in flushed_redis(redis_test_db()):
        yield ledger_env(tmp_path_factory.mktemp("dashboard"), url)
