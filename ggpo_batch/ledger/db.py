"""Engines for SQLite (embedded default) and PostgreSQL, and the Alembic schema guard.

SQLite: WAL, a 5 s busy timeout, and every transaction opened with BEGIN IMMEDIATE, because a
read-then-write transaction under plain BEGIN loses updates between two writer processes
(FACTS.md). PostgreSQL: psycopg 3; transitions lock the row they change (SELECT ... FOR UPDATE).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from ..config import REPO_DIR, redact
from ..errors import ConfigError, SchemaBehindError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = REPO_DIR / "migrations"


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


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine with the ledger's transaction settings for its backend."""
    url = normalise_url(url)
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 5}, poolclass=NullPool)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # pysqlite's own BEGIN handling off; we emit ours
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)


def _alembic_config(engine: Engine):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def head_revision() -> str:
    """The newest Alembic revision this code ships."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory(str(MIGRATIONS_DIR)).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations/ must have one head, has {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (None for an empty database)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(_alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    command.downgrade(_alembic_config(engine), revision)


def check_schema(engine: Engine) -> None:
    """Refuse to run on a schema that is behind (or ahead of) this code."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return
    where = redact(engine.url.render_as_string(hide_password=True))
    if current is None:
        tables = inspect(engine).get_table_names()
        state = "has no ledger schema" if not tables else "has tables but no ledger revision"
        raise SchemaBehindError(f"the ledger at {where} {state}: run `ggpo-batch db upgrade`")
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


def connect(url: str, *, check: bool = True, retry_seconds: float = 120.0):  # type: ignore[no-untyped-def]
    """A Ledger on `url`; with `check`, refuse a schema that is not at head."""
    from . import Ledger

    engine = make_engine(url)
    if check:
        check_schema(engine)
    return Ledger(engine, retry_seconds=retry_seconds)
