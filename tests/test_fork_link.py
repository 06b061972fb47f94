"""A worker's forked jobs take one warm PostgreSQL connection in turn (ledger.fork_link): the next
job gets the last job's server backend only if that job left the connection clean.

Each job here is forked from the test process as RQ forks its work horse from the worker: the
link's worker half runs around the fork, the job's half at its end, and the job leaves by
`os._exit`, as RQ's horse does.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from ggpo_batch.ledger import fork_link
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.ledger.fork_link import ForkLink
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url, pre_ping=False)  # the worker's engine: the link, not a ping, checks
    try:
        yield eng
    finally:
        eng.dispose()


def _job(link: ForkLink, engine: Engine, body: Callable[[Engine], Any], *, clean_exit: bool = True,
         finished: bool = True) -> tuple[int, Any]:
    """Fork a job that runs `body` and reports its value; return (its wait status, the value).
    Without `clean_exit` the job skips the link's end-of-job half (a job killed on its way out);
    `finished` is what RQ recorded of the job (False: it ended with an error)."""
    link.before_fork()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the job
        os.close(r)
        code = 0
        try:
            value = body(engine)
            if clean_exit:
                link.leave_clean()
        except BaseException as exc:  # noqa: BLE001  (reported to the test, which fails on it)
            value, code = {"error": repr(exc)}, 1
        os.write(w, json.dumps(value).encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    link.after_job(status, finished=finished)
    return status, json.loads(data) if data else None


def _backend(engine: Engine) -> int:
    with engine.begin() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def test_clean_jobs_share_one_backend_and_see_each_others_commits(engine: Engine) -> None:
    link = ForkLink(engine)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS fork_link_t (n integer)"))
        conn.execute(text("DELETE FROM fork_link_t"))

    def insert_and_count(eng: Engine) -> list[int]:
        with eng.begin() as conn:
            conn.execute(text("INSERT INTO fork_link_t VALUES (1)"))
            return [int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()),
                    int(conn.execute(text("SELECT count(*) FROM fork_link_t")).scalar_one())]

    results = [_job(link, engine, insert_and_count) for _ in range(4)]
    assert [status for status, _ in results] == [0] * 4
    assert len({pid for _, (pid, _n) in results}) == 1  # one backend served every job
    assert [n for _, (_pid, n) in results] == [1, 2, 3, 4]
    assert link.opened == 1
    # the worker itself never used it meanwhile, and may after the jobs (between burst passes)
    assert _backend(engine) == results[0][1][0]


def test_a_killed_job_ends_its_session_and_the_next_job_gets_a_new_backend(engine: Engine) -> None:
    link = ForkLink(engine)

    def die_inside_a_transaction(eng: Engine) -> None:
        conn = eng.connect()
        conn.execute(text("SELECT pg_backend_pid()"))  # a transaction begun, never ended
        os.kill(os.getpid(), signal.SIGKILL)

    first = _job(link, engine, _backend)[1]
    status, _ = _job(link, engine, die_inside_a_transaction)
    assert os.WIFSIGNALED(status)
    after = _job(link, engine, _backend)[1]
    assert after != first and link.opened == 2


def test_a_reply_left_unread_is_never_taken_by_the_next_job(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that sent a query and exited normally without reading its reply (so its own half
    of the link did not run) leaves bytes on the socket. The worker sees them and opens a new
    connection; without that look (planted below), the next job's first reply is the stale one."""

    def send_and_leave(eng: Engine) -> None:
        with eng.connect() as conn:
            conn.connection.dbapi_connection.pgconn.send_query(b"SELECT 424242")  # type: ignore[union-attr]
            os._exit(0)

    def first_reply(eng: Engine) -> int:
        """The first reply the job reads after its own query, read as libpq delivers it."""
        with eng.connect() as conn:
            pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
            pgconn.send_query(b"SELECT pg_backend_pid()")
            value = int(pgconn.get_result().get_value(0, 0))
            while pgconn.get_result() is not None:
                pass
            return value

    link = ForkLink(engine)
    first = _job(link, engine, _backend)[1]
    _job(link, engine, send_and_leave, clean_exit=False)
    answer = _job(link, engine, first_reply)[1]
    assert answer not in (first, 424242) and link.opened == 2

    look = fork_link._has_input
    monkeypatch.setattr(fork_link, "_has_input", lambda fd: False)  # the planted defect: never look
    _job(link, engine, send_and_leave, clean_exit=False)
    assert link._fd is not None
    wait_until(lambda: look(link._fd), 10, "the stale reply on the worker's connection")
    assert _job(link, engine, first_reply)[1] == 424242  # another job's reply, taken for this one's
    assert link.opened == 2


def test_a_job_ending_inside_a_transaction_closes_the_connection(engine: Engine,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose code left a transaction open (and exited normally) closes the shared
    connection at its end, so the next job gets a new backend. Without that (planted below), the
    next job's statements run inside the old job's transaction."""
    held = []  # the open connection stays referenced: its garbage collection would roll it back

    def leave_a_transaction_open(eng: Engine) -> None:
        conn = eng.connect()
        conn.execute(text("SELECT set_config('ggpo.mark', 'left open', true)"))  # for this transaction only
        held.append(conn)

    def mark_seen(eng: Engine) -> str:
        with eng.begin() as conn:
            return str(conn.execute(text("SELECT current_setting('ggpo.mark', true)")).scalar_one() or "")

    link = ForkLink(engine)
    _job(link, engine, leave_a_transaction_open)
    assert _job(link, engine, mark_seen)[1] == ""
    assert link.opened == 2

    monkeypatch.setattr(ForkLink, "leave_clean", lambda self: None)  # the planted defect
    _job(link, engine, leave_a_transaction_open)
    assert _job(link, engine, mark_seen)[1] == "left open"  # inside the previous job's transaction


def test_a_job_ended_by_an_error_hands_nothing_on(engine: Engine) -> None:
    """A job stopped by an error (RQ's timeout, say) can have left a query running on the server,
    which answers after the worker looked: the next job gets a new backend."""
    link = ForkLink(engine)
    first = _job(link, engine, _backend)[1]
    _job(link, engine, _backend, finished=False)
    assert _job(link, engine, _backend)[1] != first and link.opened == 2


def test_sqlite_has_no_shared_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    eng = make_engine(f"sqlite:///{tmp_path / 'l.sqlite3'}")
    link = ForkLink(eng)
    link.before_fork()
    assert not link.shared and link.opened == 0 and eng.pool.checkedin() == 0  # type: ignore[attr-defined]
    eng.dispose()


def test_a_worker_that_cannot_reach_the_server_forks_the_job_anyway(engine: Engine) -> None:
    """PostgreSQL down when a job is due: the worker does not fail; the job connects by itself
    (and the ledger's retries wait for the server), and the next fork tries the link again."""
    down = make_engine(engine.url.set(port=1).render_as_string(hide_password=False), pre_ping=False)
    link = ForkLink(down)
    link.before_fork()  # no exception: nothing in the pool, the job will open its own
    assert link.opened == 0 and down.pool.checkedin() == 0  # type: ignore[attr-defined]
    down.dispose()
