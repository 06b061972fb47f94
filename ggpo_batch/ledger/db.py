"""Engines for SQLite (embedded default) and PostgreSQL, and the Alembic schema guard.

SQLite: WAL, a 5 s busy timeout, and every transaction opened with BEGIN IMMEDIATE, because a
read-then-write transaction under plain BEGIN loses updates between two writer processes
(FACTS.md). PostgreSQL: psycopg 3; transitions lock the row they change (SELECT ... FOR UPDATE).
An engine made `reading` writes nothing, on a ledger the user may not write too (read_only.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url

from ..common.datafiles import MIGRATIONS_DIR
from ..common.printable import printable
from ..config.secrets import redact
from ..errors import ConfigError, LedgerError, SchemaBehindError, Unavailable

log = logging.getLogger(__name__)


def normalise_url(url: str) -> str:
    """Map plain `postgresql://` to the psycopg 3 driver; refuse what the ledger does not support."""
    try:
        u = make_url(url)
    except Exception:
        raise ConfigError(f"GGPO_DB_URL {redact(url)!r} is not a database URL") from None
    backend = u.get_backend_name()
    if backend == "postgresql":
        if u.drivername in ("postgresql", "postgres", "postgresql+psycopg2"):
            u = u.set(drivername="postgresql+psycopg")
    elif backend != "sqlite":
        raise ConfigError(f"GGPO_DB_URL: backend {backend!r} is not supported (sqlite or postgresql)")
    return u.render_as_string(hide_password=False)


def make_engine(url: str, *, pre_ping: bool = True, reading: bool = False) -> Engine:
    """A SQLAlchemy engine with the ledger's transaction settings for its backend. Without
    `pre_ping`, a PostgreSQL connection taken from the pool is not tested first (a round trip
    each time): a dead one then fails its first statement, and the ledger's retry reconnects.
    With `reading`, one that writes nothing (read-only transactions; on SQLite, a file opened as
    `read_only.plan_sqlite_read` says, nothing created beside it)."""
    url = normalise_url(url)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if reading and u.database and u.database != ":memory:":
            return _sqlite_reading_engine(url, Path(u.database).expanduser())
        if u.database and u.database != ":memory:":
            folder = Path(u.database).expanduser().parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise Unavailable(f"the ledger's folder {folder} cannot be created ({exc.strerror})") from None
        # Pooled, not a connection per transaction: closing the last connection to a WAL database
        # checkpoints it, which cost more than the transaction itself (4 ms each, 6 per submitted run).
        engine = create_engine(url, connect_args={"timeout": 5}, pool_size=1, max_overflow=8)
        db_file = Path(u.database).expanduser() if u.database and u.database != ":memory:" else None

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            if db_file is not None:
                refuse_truncated_sqlite(db_file)
            _sqlite_pragmas(dbapi_conn, "PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL")

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    # A host that accepts the connection but never answers (another service on that port, a
    # firewall that drops packets) must not hang a command: bounded connect, TCP keepalives after.
    connect_args = {k: v for k, v in PG_CONNECT_ARGS.items() if k not in u.query}
    engine = create_engine(url, pool_pre_ping=pre_ping, pool_size=2, max_overflow=4, connect_args=connect_args)
    if reading:
        # psycopg then opens every transaction with BEGIN READ ONLY: no extra round trip, and no
        # startup option a connection pooler (pgbouncer) might refuse.
        @event.listens_for(engine, "connect")
        def _read_only(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.read_only = True

    return engine


def _sqlite_pragmas(dbapi_conn, *pragmas: str) -> None:  # type: ignore[no-untyped-def]
    """Every ledger connection's settings, then `pragmas`."""
    dbapi_conn.isolation_level = None  # pysqlite's own BEGIN handling off; we emit ours
    cur = dbapi_conn.cursor()
    for pragma in (*pragmas, "PRAGMA foreign_keys=ON", "PRAGMA busy_timeout=5000"):
        cur.execute(pragma)
    cur.close()


def _sqlite_reading_engine(url: str, path: Path) -> Engine:
    """An engine that only reads the SQLite ledger at `path`: no journal mode set, transactions
    DEFERRED (a snapshot, no write lock), `query_only`; each connection opened by a
    `read_only.SqliteReader` and replaced when the pool finds it outdated. Nothing is created, the
    ledger's folder included."""
    from sqlalchemy.exc import DisconnectionError

    from .read_only import SqliteReader

    reader = SqliteReader(path)

    def connection():  # type: ignore[no-untyped-def]
        refuse_truncated_sqlite(path)
        return reader()

    engine = create_engine(url, creator=connection, pool_size=1, max_overflow=8)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        _sqlite_pragmas(dbapi_conn, "PRAGMA query_only=ON")

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn, _record, _proxy) -> None:  # type: ignore[no-untyped-def]
        if reader.outdated(dbapi_conn):
            raise DisconnectionError("the ledger changed since this connection read it")

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        conn.exec_driver_sql("BEGIN")

    return engine


def refuse_truncated_sqlite(path: Path) -> None:
    """Raise sqlite3.DatabaseError if the file is shorter than its own header says.

    SQLite itself notices a truncated file only when a query reads a missing page, so a command
    that reads the first pages only (a dry run, an empty status) would go on with a ledger that
    has lost rows. With no write-ahead log beside it, a healthy file is never shorter than the
    page count in its header; while a log exists, the header may lag it, so nothing is checked.
    A shortfall seen while another process's last connection checkpoints and removes its log
    (header written, file not yet extended) is gone a moment later: it is looked at twice.
    """
    import sqlite3

    for look in range(2):
        short = _shortfall(path)
        if short is None:
            return
        if look == 0:
            time.sleep(0.05)
    size, pages, page_size = short
    error = sqlite3.DatabaseError(f"database disk image is malformed: {path} is {size} bytes, its header "
                                  f"says {pages} pages of {page_size} bytes (the file was truncated)")
    error.sqlite_errorcode, error.sqlite_errorname = sqlite3.SQLITE_CORRUPT, "SQLITE_CORRUPT"  # as SQLite's own would
    raise error


def _shortfall(path: Path) -> tuple[int, int, int] | None:
    """(file size, header's page count, page size) when the file is shorter than its header says
    and no write-ahead log is pending; None otherwise (or when that cannot be told)."""
    wal = Path(f"{path}-wal")
    try:
        if wal.exists() and wal.stat().st_size > 0:
            return None
        with path.open("rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
        if wal.exists() and wal.stat().st_size > 0:
            return None
    except OSError:
        return None  # absent or unreadable: SQLite's own open gives the error
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return None  # empty (a new ledger) or not SQLite at all: SQLite's own error says which
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    change_counter, valid_for = header[24:28], header[92:96]
    if change_counter == valid_for and pages and size < pages * page_size:
        return size, pages, page_size
    return None


PG_CONNECT_ARGS = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                   "keepalives_count": 3}


def _alembic_config(engine: Engine):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


# The newest Alembic revision this code ships. Every command checks the database against it, so
# it is a constant here rather than read from migrations/ (importing alembic costs ~0.5 s a
# command); tests/test_migrations.py fails if it differs from migrations/' own head.
HEAD_REVISION = "0013"


def head_revision() -> str:
    """The newest Alembic revision this code ships."""
    return HEAD_REVISION


def migrations_head() -> str:
    """The head of migrations/ as Alembic computes it (for `db` commands and the drift test)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations/ must have one head, has {heads}")
    return heads[0]


REVISION_SHOWN_MAX = 80


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database), read from Alembic's own
    `alembic_version` table without importing Alembic."""
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        rows = [printable(r, REVISION_SHOWN_MAX) for r in conn.execute(text("SELECT version_num FROM alembic_version")).scalars()]
    if len(rows) > 1:
        raise SchemaBehindError(f"the ledger has several revisions ({', '.join(rows)}); run `ggpo-batch db upgrade`")
    return rows[0] if rows else None


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to `revision`; a database this code did not create, or a revision it does not know,
    is refused (LedgerError, one line) before Alembic touches it."""
    from alembic import command

    _refuse_unknown_schema(engine)
    with _alembic_errors(revision):
        command.upgrade(_alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    _refuse_unknown_schema(engine)
    with _alembic_errors(revision):
        command.downgrade(_alembic_config(engine), revision)


NOT_OURS = ("has tables but no ledger revision: it was not made by `ggpo-batch db upgrade`, or its alembic_version "
            "table was lost; point GGPO_DB_URL at a ggpo-batch ledger or an empty database (db upgrade does not "
            "write over tables it did not make)")


def _refuse_unknown_schema(engine: Engine) -> None:
    current = current_revision(engine)
    where = redact(engine.url.render_as_string(hide_password=True))
    if current is None:
        if _ledger_tables(engine):
            raise SchemaBehindError(f"the ledger at {where} {NOT_OURS}")
        return
    if current not in _known_revisions():
        raise SchemaBehindError(f"the ledger at {where} is at revision {current}, which this code does not know "
                                f"(newer than {head_revision()}?): upgrade ggpo-batch")


def _ledger_tables(engine: Engine) -> set[str]:
    """The ledger's own tables that exist in the database (other tables, and Alembic's, aside)."""
    from .schema import Base

    return set(inspect(engine).get_table_names()) & set(Base.metadata.tables)


def _known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    return {rev.revision for rev in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()}


@contextmanager
def _alembic_errors(revision: str) -> Iterator[None]:
    """Alembic's own refusals (an unknown target revision) as one line."""
    from alembic.util.exc import CommandError

    try:
        yield
    except CommandError as exc:
        raise LedgerError(f"cannot migrate the ledger to {revision!r}: {str(exc).splitlines()[0]}") from None


def check_schema(engine: Engine) -> None:
    """Refuse to run on a schema that is behind (or ahead of) this code."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    where = redact(engine.url.render_as_string(hide_password=True))
    if current is None:
        tables = _ledger_tables(engine)
        if tables:
            raise SchemaBehindError(f"the ledger at {where} {NOT_OURS}")
        raise SchemaBehindError(f"the ledger at {where} has no ledger schema: run `ggpo-batch db upgrade`")
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS_DIR))
    known = {rev.revision for rev in script.walk_revisions()}
    if current not in known:
        raise SchemaBehindError(
            f"the ledger at {where} is at revision {current}, newer than this code ({head}): upgrade ggpo-batch"
        )
    raise SchemaBehindError(
        f"the ledger at {where} is at revision {current}, this code needs {head}: run `ggpo-batch db upgrade`"
    )


def is_empty(engine: Engine) -> bool:
    """True when the ledger holds no experiment and no decision: then `status` shows nothing,
    whatever it is asked. One query, without the ORM, so `status` on a new ledger starts fast."""
    anything = text("SELECT EXISTS (SELECT 1 FROM experiments) OR EXISTS (SELECT 1 FROM decisions)")
    with engine.connect() as conn:
        return not conn.execute(anything).scalar()

