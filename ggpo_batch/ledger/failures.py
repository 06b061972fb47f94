"""Whether a database failure is worth waiting out (transient) or not (permanent), told by the
driver's codes, never by message text: PostgreSQL translates its messages (`lc_messages`), so
"does not exist" or "password authentication failed" match nothing on a German server.

- PostgreSQL, an error with a SQLSTATE: its class or code (`TRANSIENT_SQLSTATE_CLASSES`,
  `TRANSIENT_SQLSTATES`); any other SQLSTATE is permanent.
- PostgreSQL, a failed connection: libpq gives no SQLSTATE there (psycopg issue 1188), so the
  server is asked with libpq's own ping (`PQping`, which authenticates nothing): no answer (TCP
  refused or timed out) or "rejecting connections" (starting up, shutting down, recovering:
  SQLSTATE 57P03, which libpq reads itself) is transient; a server that answers and accepts
  connections refused this one with a FATAL (unknown database or role, wrong password, no
  pg_hba.conf entry, too many connections): permanent.
- A lost connection in the middle of a statement (no SQLSTATE, no connection attempt): transient.
- SQLite: the result code (`sqlite_errorcode`, Python >= 3.11): read-only, cannot open, not a
  database, corrupt, no permission are permanent (`PERMANENT_SQLITE`); busy, locked, an I/O error
  or a full disk are waited out.
"""

from __future__ import annotations

import sqlite3

# Connection exceptions, transaction rollbacks (serialization failure, deadlock), insufficient
# resources, system errors (I/O).
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "58"})
# admin_shutdown, crash_shutdown, cannot_connect_now; lock_not_available, object_in_use.
TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "55P03", "55006"})
PERMANENT_SQLITE = frozenset({sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB,
                              sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH})
# The longest the classification's ping may wait for a server that does not answer (libpq's minimum is 2).
PING_TIMEOUT_S = 3


def driver_error(exc: BaseException) -> BaseException:
    """The DBAPI driver's own exception inside a SQLAlchemy one (or `exc` itself)."""
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, BaseException) else exc


def sqlstate(exc: BaseException) -> str | None:
    """PostgreSQL's SQLSTATE of a failure, where the driver gives one."""
    code = getattr(driver_error(exc), "sqlstate", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def sqlite_code(exc: BaseException) -> int | None:
    """SQLite's primary result code of a failure, where the driver gives one."""
    code = getattr(driver_error(exc), "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def permanent(exc: BaseException) -> bool:
    """True for a failure that waiting does not cure: retrying it only delays the one-line error."""
    code = sqlstate(exc)
    if code is not None:
        return not (code[:2] in TRANSIENT_SQLSTATE_CLASSES or code in TRANSIENT_SQLSTATES)
    lite = sqlite_code(exc)
    if lite is not None:
        return lite in PERMANENT_SQLITE
    if isinstance(driver_error(exc), sqlite3.Error):
        return False  # raised without a code: SQLite's own errors carry one
    return _refused_by_a_live_server(driver_error(exc))


def _refused_by_a_live_server(err: BaseException) -> bool:
    """A psycopg connection attempt that failed although the server answers and accepts
    connections (so a FATAL refused it); False for any other failure without a SQLSTATE."""
    pgconn = getattr(err, "pgconn", None)
    if pgconn is None or getattr(pgconn, "backend_pid", 0) or not getattr(pgconn, "host", None):
        return False  # not a connection attempt (a connection lost mid-statement)
    try:
        from psycopg import pq
        from psycopg.conninfo import make_conninfo
    except ImportError:  # pragma: no cover - psycopg is a dependency
        return False
    return pq.PGconn.ping(make_conninfo("", **_ping_params(pgconn)).encode()) == pq.Ping.OK


def _ping_params(pgconn) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The failed attempt's connection parameters a ping needs: where, who and how (TLS), no secret."""
    wanted = {"host", "hostaddr", "port", "dbname", "user", "sslmode", "sslrootcert", "sslcert", "sslkey",
              "gssencmode", "target_session_attrs", "connect_timeout"}
    params = {}
    for option in pgconn.info:
        key = option.keyword.decode()
        if key in wanted and option.val:
            params[key] = option.val.decode()
    given = params.get("connect_timeout")
    params["connect_timeout"] = str(min(int(given), PING_TIMEOUT_S) if given and given.isdigit() and int(given) > 0
                                    else PING_TIMEOUT_S)
    return params
