"""One warm PostgreSQL connection that a worker's forked jobs use in turn.

A job that opens its own connection makes the server start a backend and load its catalogues
for every run, in a process where every page Python touches is first copied (fork's copy on
write): measured with tools/bench/worker_drain.py, about half of a PostgreSQL job's time. So the
worker keeps one idle connection in its engine's pool and never uses it while a job runs; each
job inherits it at the fork, uses it, and exits without closing it (RQ's work horse leaves by
`os._exit`), and the next job finds the same backend, warm.

The worker hands the connection on only if the last job left it as it found it:
- the job's process exited normally (a killed job may have stopped in the middle of anything)
  and its RQ job finished (one stopped by an error, a timeout say, may have left a query
  running on the server, whose reply would come after the worker looked);
- the job itself closed it if it ended inside a transaction or a reply (`leave_clean`), so the
  server ends that session;
- nothing is waiting on the socket. An idle connection has nothing to say: bytes there are a
  reply the job did not read, which the next job would take for its own, or the server's
  goodbye (a restart, a closed session).
Otherwise the worker closes its copy and opens a new one. Only an unencrypted connection can be
shared this way: TLS and GSSAPI keep per-message state in the process that last wrote, which the
next job (forked from the worker) would not have; such a ledger gets a connection per job.
A connection's server-side prepared statements would also diverge between jobs, so the shared
one never prepares any.
"""

from __future__ import annotations

import logging
import os
import select
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

log = logging.getLogger(__name__)


def _has_input(fd: int) -> bool:
    """True if the socket has bytes (or an end of stream) to read, without waiting."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


class ForkLink:
    """The worker's half (`before_fork`, `after_job`) and the job's half (`leave_clean`) of the
    connection its jobs share. `shared` is False for a backend or a connection that cannot be
    shared: then each job opens its own, as without a link."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.shared = engine.dialect.name == "postgresql"
        self._dbapi: Any = None  # the psycopg connection (in a job: the one it inherited)
        self._fd: int | None = None
        self.opened = 0  # connections the worker has opened for its jobs (1 while they stay clean)

    def before_fork(self) -> None:
        """In the worker, before it forks a job: one idle connection in the pool for the job
        (the last job's, if nothing came in on it since; else a new one) and no other."""
        if not self.shared:
            return
        if self._fd is not None and self._dbapi.closed:  # the worker's own use found it broken
            self._drop("the worker closed it")
        elif self._fd is not None and _has_input(self._fd):
            self._drop("bytes or an end of stream arrived on the idle connection")
        if self._fd is None:
            try:
                self._open()
            except (SQLAlchemyError, OSError) as exc:  # the job connects itself, with the ledger's retries
                log.warning("could not open the ledger connection for the next job: %s", exc)
                self.engine.dispose()

    @property
    def holding(self) -> bool:
        """True while the worker holds a connection for its jobs."""
        return self._fd is not None

    def after_job(self, wait_status: int | None, *, finished: bool) -> None:
        """In the worker, once the job's process is reaped (`wait_status` from waitpid; None if
        it was not reaped): keep the connection for the next job only if the job exited
        normally, `finished` (its RQ job ended without an error) and left nothing to read on
        it. A job stopped by an error may have left a query running, whose reply comes later."""
        if self._fd is None:
            return
        if wait_status is None or not os.WIFEXITED(wait_status) or os.WEXITSTATUS(wait_status) != 0:
            self._drop(f"the job's process ended with wait status {wait_status}")
        elif not finished:
            self._drop("the job ended with an error")
        elif _has_input(self._fd):
            self._drop("the job left bytes or an end of stream on the connection")

    def leave_clean(self) -> None:
        """In the job, as it ends: a shared connection left inside a transaction or a reply is
        closed, so its server session ends and the worker does not hand it on."""
        conn = self._dbapi
        if conn is None or conn.closed:
            return
        from psycopg.pq import TransactionStatus

        if conn.pgconn.transaction_status != TransactionStatus.IDLE:
            log.warning("the job ended with the ledger connection %s: closing it",
                        conn.pgconn.transaction_status.name)
            conn.close()

    def _open(self) -> None:
        self.engine.dispose()  # nothing else in the pool: the job must be given this connection
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
            dbapi = conn.connection.dbapi_connection
            pgconn = dbapi.pgconn  # type: ignore[union-attr]
            if pgconn.ssl_in_use or pgconn.used_gssapi:
                log.info("the ledger connection is encrypted: each job opens its own")
                self.shared = False
            else:
                dbapi.prepare_threshold = None  # type: ignore[union-attr]
        if not self.shared:
            self.engine.dispose()
            return
        self._dbapi, self._fd = dbapi, dbapi.fileno()  # type: ignore[union-attr]
        self.opened += 1
        log.info("opened the ledger connection its jobs share (server backend %d)", pgconn.backend_pid)

    def _drop(self, why: str) -> None:
        log.info("ledger connection not handed to the next job: %s", why)
        self._dbapi = self._fd = None
        self.engine.dispose()  # the job that used it is gone: closing ends its server session
