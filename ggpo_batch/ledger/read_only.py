"""Reading a ledger one may not write, and refusing a write before it starts.

A reading command (`status`, `report`, `ledger export`, `logs`, `notifications`, `dashboard`, `db
current`, `enqueue --dry-run`) opens the ledger so that it writes nothing at all: on PostgreSQL every transaction
begins READ ONLY; on SQLite no journal mode is set, transactions begin DEFERRED, `query_only` is
on, and the file is opened as what lies beside it allows (`plan_sqlite_read`; SQLite 3.40):

| the ledger file is           | beside it                               | opened                 | answers          |
| writable by you (and folder) | anything                                | `mode=ro`              | current          |
| read-only to you             | a `-wal` and a readable `-shm`          | `mode=ro`              | current          |
| read-only to you             | no `-wal` (or an empty one, no `-shm`)  | `immutable=1`          | see below        |
| read-only to you             | a `-wal` with commits, no readable `-shm` | a copy of both, `mode=ro` | the copy's |
| absent                       |                                         | an empty database      | "run db upgrade" |
| not readable by you          |                                         | refused, exit 6        |                  |

`mode=ro` alone fails in the last three rows: SQLite must create the `-wal` and `-shm` beside a WAL
database to read it ("attempt to write a readonly database"; "unable to open database file" when a
`-wal` is there without its `-shm`), and files made beside a ledger one may not write would belong
to the reader, where its owner's writers could not use them. `immutable=1` ignores a `-wal`: it
would miss the transactions of the fourth row, which a copy (in the temporary folder, removed when
the process ends) replays.

Staleness: an immutable or copied connection is checked whenever the pool hands it out, and
replaced (opened again by the table) when the file or its `-wal` changed since it was opened, so
an answer is at most one ledger call old. Within that call a writer (the ledger's owner, where the
file or its folder is writable by anyone) can change the file under it: the answer may then be the
state before that write, or, rarely, "database disk image is malformed" (exit 4; run it again). A
ledger nobody can write (read-only storage, a frozen copy) always answers exactly.

A writing command asks first (`require_writable`): on SQLite, the file, its folder and any `-wal`
and `-shm` must be writable by this user; on PostgreSQL the role must hold INSERT on the ledger's
tables (CREATE on the schema, before they exist). If not: `NotPermitted` (exit 6), one line,
nothing done. What the database refuses later anyway (`write_refused`) is explained the same way.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, text

from ..config.secrets import redact
from ..errors import NotPermitted
from .failures import sqlite_code, sqlstate

log = logging.getLogger(__name__)

# What a reader of a ledger it may not write can still run (named in the refusals).
READING_COMMANDS = ("status, report, costs, ledger export, logs, notifications, dashboard, db current, "
                    "enqueue --dry-run, plan, advise, canary")

Signature = tuple[tuple[int, int, int] | None, tuple[int, int, int] | None]


@dataclass(frozen=True)
class ReadPlan:
    """How a reading connection opens a SQLite ledger: `how` is mode=ro, immutable, copy or absent."""

    how: str
    why: str


def plan_sqlite_read(path: Path) -> ReadPlan:
    """How to read the SQLite ledger at `path` now, writing nothing (the module's table)."""
    wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
    try:
        path.stat()
    except FileNotFoundError:
        return ReadPlan("absent", "no such file: read as an empty database")
    except OSError as exc:  # a folder one may not enter
        raise NotPermitted(f"reading the ledger {path}", f"you may not open its folder {path.parent} "
                           f"({exc.strerror})") from None
    if not os.access(path, os.R_OK):
        raise NotPermitted(f"reading the ledger {path}", "you may not read the file")
    if _may_write(path) and _may_write(path.parent):
        return ReadPlan("mode=ro", "writable by you: read through SQLite's own locks")
    if wal.exists() and os.access(shm, os.R_OK):
        return ReadPlan("mode=ro", "read-only to you; its -wal and -shm are there: read through them")
    if _size(wal):
        return ReadPlan("copy", "read-only to you; its -wal has transactions but there is no -shm: read a copy")
    frozen = not (_anyone_may_write(path) or _anyone_may_write(path.parent))
    return ReadPlan("immutable", "read-only to you, without a -wal: read as immutable"
                    + (" (nobody may write it: exact)" if frozen else " (checked for changes at every call)"))


class SqliteReader:
    """The `creator` of a reading engine's connections: each one opened as `plan_sqlite_read` says
    at that moment; `outdated` tells the pool to replace an immutable or copied one that the ledger
    has moved past."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._copies: Path | None = None  # a private folder for the copies, made on first need
        self._copy: tuple[Signature, Path] | None = None

    def __call__(self) -> sqlite3.Connection:
        seen = self.signature()
        plan = plan_sqlite_read(self.path)
        log.info("reading the ledger %s: %s", self.path, plan.why)
        if plan.how == "absent":
            uri = "file::memory:"
        elif plan.how == "copy":
            uri = f"file:{quote(str(self._copied(seen)))}?mode=ro"
        else:
            uri = f"file:{quote(str(self.path))}?{'mode=ro' if plan.how == 'mode=ro' else 'immutable=1'}"
        conn = sqlite3.connect(uri, uri=True, timeout=5, check_same_thread=False, factory=_ReadConnection)
        conn.ggpo_plan, conn.ggpo_seen = plan, seen
        return conn

    def outdated(self, conn: Any) -> bool:
        """True when `conn` reads a state of the ledger that is no longer the file's (immutable, a
        copy, or the empty stand-in of an absent file) and must be opened again."""
        plan = getattr(conn, "ggpo_plan", None)
        return plan is not None and plan.how != "mode=ro" and conn.ggpo_seen != self.signature()

    def signature(self) -> Signature:
        """What changes when anyone writes the ledger: the file's and its -wal's identity, size, mtime."""
        return _stat(self.path), _stat(_beside(self.path, "-wal"))

    def _copied(self, seen: Signature) -> Path:
        """A copy of the ledger and its -wal as of `seen`, in a private folder (removed with this
        reader); SQLite replays the log there."""
        with self._lock:
            if self._copy is not None and self._copy[0] == seen:
                return self._copy[1]
            if self._copies is None:
                self._copies = Path(tempfile.mkdtemp(prefix="ggpo-ledger-read-"))
                weakref.finalize(self, shutil.rmtree, self._copies, True)
            folder = Path(tempfile.mkdtemp(dir=self._copies))
            target = folder / self.path.name
            shutil.copyfile(self.path, target)
            shutil.copyfile(_beside(self.path, "-wal"), _beside(target, "-wal"))
            if self._copy is not None:  # an open connection keeps reading its files after they go
                shutil.rmtree(self._copy[1].parent, ignore_errors=True)
            self._copy = (seen, target)
            return target


class _ReadConnection(sqlite3.Connection):
    """A sqlite3 connection that remembers how it was opened (for `SqliteReader.outdated`)."""

    ggpo_plan: ReadPlan
    ggpo_seen: Signature


def require_writable(engine: Engine, command: str) -> None:
    """Raise NotPermitted (exit 6) if this user or role may not write the ledger of `engine`;
    `command` names what was refused."""
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if not database or database == ":memory:":
            return
        path = Path(database).expanduser()
        why = sqlite_write_problem(path)
        if why:
            raise NotPermitted(f"`{command}` writes to the ledger {path}", f"which is read-only to you: {why}; "
                               f"reading commands work on it ({READING_COMMANDS})")
        return
    why = _pg_write_problem(engine)
    if why:
        where = redact(engine.url.render_as_string(hide_password=True))
        raise NotPermitted(f"`{command}` writes to the ledger {where}", f"{why}; reading commands work with "
                           f"this role ({READING_COMMANDS})")


def sqlite_write_problem(path: Path) -> str | None:
    """Why this user may not write the SQLite ledger at `path` (None: it may, or it cannot be told
    before trying, e.g. a folder that does not exist yet)."""
    folder = path.parent
    if not path.exists():
        if folder.is_dir() and not _may_write(folder):
            return f"you may not create files in its folder {folder}"
        return None
    if not _may_write(path):
        return "you may not write the file"
    if not _may_write(folder):
        return f"you may not write its folder {folder} (SQLite writes its -wal and -shm beside the file)"
    for side in ("-wal", "-shm"):
        if _beside(path, side).exists() and not _may_write(_beside(path, side)):
            return f"you may not write {_beside(path, side).name} beside it (another user's process made it)"
    return None


_PG_PRIVILEGES = text("""
SELECT current_user AS role, current_schema() AS schema, count(to_regclass(t)) AS tables,
       coalesce(bool_or(has_table_privilege(to_regclass(t), 'INSERT')), false) AS may_insert,
       coalesce(has_schema_privilege(current_schema(), 'CREATE'), false) AS may_create
FROM unnest(CAST(:tables AS text[])) AS t
""")


def _pg_write_problem(engine: Engine) -> str | None:
    """Why the connected role may not write the ledger: no INSERT on any of its tables (a role
    granted SELECT only), or, before they exist, no CREATE on the schema. A finer grant (some
    tables, some rows) is the database's to enforce; `write_refused` explains its refusals."""
    from .schema import Base

    with engine.connect() as conn:
        row = conn.execute(_PG_PRIVILEGES, {"tables": sorted(Base.metadata.tables)}).one()
    if row.tables and not row.may_insert:
        return (f"the PostgreSQL role {row.role!r} has no INSERT privilege on its tables (it may only read "
                f"them)")
    if not row.tables and not row.may_create:
        return (f"the PostgreSQL role {row.role!r} has no CREATE privilege on schema {row.schema!r} to make "
                f"the ledger's tables")
    return None


_PG_BOOKS_ATTEMPTS = text("SELECT session_user AS role, to_regclass('attempts') IS NULL "
                          "OR has_column_privilege('attempts', 'gpu_hours_scheduler', 'UPDATE') AS may")


def require_service(engine: Engine, command: str) -> None:
    """Refuse (NotPermitted, exit 6) a command that books every run's attempts (`worker`,
    `reconcile`) to a PostgreSQL role that may not: on a team ledger that is the workers' service
    role's work (a member of ggpo_service; the ledger's owner may too). SQLite: nothing to check."""
    if engine.dialect.name != "postgresql":
        return
    with engine.connect() as conn:
        row = conn.execute(_PG_BOOKS_ATTEMPTS).one()
    if not row.may:
        raise NotPermitted(f"`{command}` books the attempts of every run", f"the PostgreSQL role {row.role!r} may "
                           f"not update attempts: on a team ledger that is the workers' service role's work (a member "
                           f"of ggpo_service); members enqueue, cancel, retry and decide")


# PostgreSQL's insufficient_privilege, and read_only_sql_transaction (a write in a reading command).
_PG_REFUSALS = ("42501", "25006")


def write_refused(exc: BaseException) -> NotPermitted | None:
    """The refusal in a database error raised by a write the user may not make (PostgreSQL's
    insufficient privilege, SQLite's read-only database), as NotPermitted; None for any other.
    Each ledger call is one transaction: nothing of it was written."""
    orig = getattr(exc, "orig", None)
    first = str(orig if orig is not None else exc).strip().splitlines()
    first_line = first[0] if first else type(exc).__name__
    if sqlstate(exc) in _PG_REFUSALS or sqlite_code(exc) == sqlite3.SQLITE_READONLY:
        return NotPermitted("the ledger refused a write (nothing was written)", first_line)
    return None


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _may_write(path: Path) -> bool:
    return os.access(path, os.W_OK)


def _anyone_may_write(path: Path) -> bool:
    """Whether anyone (the owner, a group, everyone) may write `path`, by its mode and its mount."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return False
        return bool(path.stat().st_mode & 0o222)
    except OSError:
        return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        s = path.stat()
    except OSError:
        return None
    return s.st_ino, s.st_size, s.st_mtime_ns
