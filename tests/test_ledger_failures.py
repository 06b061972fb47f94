"""The ledger tells a failure to wait out from one to report at once by the driver's codes, not by
English message text (ggpo_batch/ledger/failures.py): proven on a PostgreSQL of the test's own
that speaks German (lc_messages=de_DE.UTF-8, the locale built into the test's folder with
localedef and found through LOCPATH: the machine need not have it), and on SQLite's result codes."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from ggpo_batch.common.netutil import free_port
from ggpo_batch.ledger import connect
from ggpo_batch.ledger.failures import permanent, sqlstate

from .faults.pgcluster import PrivateCluster

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]
PASSWORD = "pw-failures-0123"
RETRY_S = 20.0  # how long the old text matching waited out a German refusal before reporting it


def _unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def german() -> PrivateCluster:  # type: ignore[misc]
    if shutil.which("localedef") is None or not Path("/usr/share/i18n/locales/de_DE").exists():
        _unavailable("building the de_DE locale needs localedef and glibc's locale sources (locales package)")
    try:
        cluster = PrivateCluster(port=free_port(), password=PASSWORD)
    except (FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a private PostgreSQL: {exc}")
    try:
        locales = cluster.root / "locales"
        locales.mkdir()
        subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(locales / "de_DE.UTF-8")], check=True,
                       capture_output=True)
        cluster.start(settings={"lc_messages": "de_DE.UTF-8"}, env={"LOCPATH": str(locales)})
        yield cluster
    finally:
        cluster.destroy()


def _german_text(exc: BaseException) -> str:
    message = str(exc)
    if "existiert nicht" not in message and "fehlgeschlagen" not in message:
        _unavailable(f"the server did not answer in German (its translations missing?): {message}")
    return message


def _fails_at_once(url: str) -> OperationalError:
    ledger = connect(url, check=False, retry_seconds=RETRY_S)
    t0 = time.monotonic()
    with pytest.raises(OperationalError) as caught:
        ledger.flagged_count(1)
    elapsed = time.monotonic() - t0
    ledger.engine.dispose()
    assert elapsed < RETRY_S / 2, f"waited {elapsed:.1f} s before reporting a refusal that waiting cannot cure"
    return caught.value


def test_a_missing_database_on_a_german_server_is_reported_at_once(german: PrivateCluster) -> None:
    exc = _fails_at_once(german.url_of(database="keine_solche"))
    assert "Datenbank" in _german_text(exc) and sqlstate(exc) is None  # libpq gives no SQLSTATE (psycopg #1188)


def test_a_wrong_password_on_a_german_server_is_reported_at_once(german: PrivateCluster) -> None:
    exc = _fails_at_once(german.url_of(password="falsch"))
    assert "Passwort" in _german_text(exc)


def test_a_port_nobody_listens_on_is_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    ledger = connect(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres", check=False, retry_seconds=2)
    t0 = time.monotonic()
    with caplog.at_level("WARNING"), pytest.raises(OperationalError):
        ledger.flagged_count(1)
    assert time.monotonic() - t0 >= 2 and "ledger unavailable" in caplog.text
    ledger.engine.dispose()


def test_a_server_that_never_answers_is_waited_out(caplog: pytest.LogCaptureFixture) -> None:
    """TCP accepted (the listen backlog) but no PostgreSQL answer: the connection times out, the
    ping too, and the call is retried until its time is up."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        ledger = connect(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres?connect_timeout=2", check=False,
                         retry_seconds=3)
        t0 = time.monotonic()
        with caplog.at_level("WARNING"), pytest.raises(OperationalError):
            ledger.flagged_count(1)
        assert time.monotonic() - t0 >= 3 and "ledger unavailable" in caplog.text
        ledger.engine.dispose()


def test_statement_failures_are_told_by_their_sqlstate(german: PrivateCluster) -> None:
    """A lock wait given up (55P03) and a connection ended by the administrator (57P01) are waited
    out; an unknown table (42P01) is not; the messages are German throughout."""
    engine = create_engine(german.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as holder, engine.connect() as waiter:
        holder.execute(text("CREATE TABLE IF NOT EXISTS gesperrt (x int)"))
        holder.execute(text("BEGIN; LOCK TABLE gesperrt IN ACCESS EXCLUSIVE MODE"))
        waiter.execute(text("SET lock_timeout = '50ms'"))
        with pytest.raises(OperationalError) as lock:
            waiter.execute(text("SELECT * FROM gesperrt"))
        holder.execute(text("ROLLBACK"))
        with pytest.raises(Exception) as unknown:
            waiter.execute(text("SELECT * FROM keine_tabelle"))
        pid = waiter.execute(text("SELECT pg_backend_pid()")).scalar()
        holder.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(OperationalError) as ended:
            waiter.execute(text("SELECT 1"))
    engine.dispose()
    assert (sqlstate(lock.value), permanent(lock.value)) == ("55P03", False)
    assert (sqlstate(unknown.value), permanent(unknown.value)) == ("42P01", True)
    assert "existiert nicht" in str(unknown.value)
    assert (sqlstate(ended.value), permanent(ended.value)) == ("57P01", False)


def test_sqlite_failures_are_told_by_their_result_code(tmp_path: Path) -> None:
    """Busy (another writer holds the lock) is waited out; not a database is not."""
    from ggpo_batch.ledger.db import make_engine

    db = tmp_path / "busy.sqlite3"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x int)")
    holder.execute("BEGIN IMMEDIATE")
    engine = create_engine(f"sqlite:///{db}", connect_args={"timeout": 0.05})
    with pytest.raises(OperationalError) as busy, engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    holder.close()
    engine.dispose()
    assert not permanent(busy.value)
    junk = tmp_path / "junk.sqlite3"
    junk.write_bytes(b"not a database at all, " * 100)
    engine = make_engine(f"sqlite:///{junk}")
    with pytest.raises(Exception) as notadb, engine.connect() as conn:
        conn.execute(text("SELECT * FROM sqlite_master"))
    engine.dispose()
    assert permanent(notadb.value)
