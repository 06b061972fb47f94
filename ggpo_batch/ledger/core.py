"""The ledger's base: sessions, the cross-process lock, the retry wrapper, the checked run move
and the event helper every transition uses. The transitions themselves live in the modules of
`Ledger`'s parts (ledger.py, attempts.py, costs.py, components.py)."""

from __future__ import annotations

import fcntl
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    CursorResult,
    Engine,
    Executable,
    String,
    Table,
    bindparam,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from ..common import metrics
from ..contracts.priorities import DEFAULT_PRIORITY
from ..errors import GgpoError, LedgerError, NotPermitted, Unavailable
from .events import check_move, event_row, notice_of, notification_row
from .failures import permanent
from .read_only import write_refused
from .schema import (
    Attempt,
    Decision,
    Event,
    Experiment,
    Notification,
    Run,
    utcnow,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
_PROCESS_LOCKS: dict[str, threading.Lock] = {}



@dataclass(frozen=True)
class NewRun:
    """A run to add to an experiment."""

    run_key: str
    arm: str
    seed: int
    config_hash: str
    run_spec: Mapping[str, Any]
    retries_allowed: int = 0
    estimated_gpu_hours: float | None = None
    priority: str = DEFAULT_PRIORITY


def _retrying(method: Callable[..., T]) -> Callable[..., T]:
    """Re-run a whole ledger call while the database is unreachable (PostgreSQL restarting, SQLite
    locked), with exponential backoff up to the ledger's `retry_seconds`; each call is one
    transaction, so a retry repeats it from the start and never half-applies it."""

    @functools.wraps(method)
    def wrapper(self: LedgerCore, *args: Any, **kwargs: Any) -> T:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.25
        while True:
            try:
                return method(self, *args, **kwargs)
            except (OperationalError, InterfaceError) as exc:
                left = deadline - time.monotonic()
                if left <= 0 or permanent(exc):
                    raise
                first = str(exc.orig).splitlines()[0] if getattr(exc, "orig", None) else type(exc).__name__
                log.warning("ledger unavailable (%s); retrying %s in %.1f s", first, method.__name__, min(delay, left))
                metrics.count(metrics.LEDGER_RETRIES)
                time.sleep(min(delay, left))
                delay = min(delay * 2, 5.0)

    return wrapper


class LedgerCore:
    """What every part of the ledger shares. Each subclass's public methods are wrapped by
    `_retrying` when the class is defined (`__init_subclass__`)."""

    def __init__(self, engine: Engine, *, retry_seconds: float = 120.0) -> None:
        self.engine = engine
        self.retry_seconds = retry_seconds
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _wrap_public(cls)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction: committed on success, rolled back on any error. An ORM UPDATE that
        changed no row (the database's row-level security filtered it out, silently) rolls it
        back and is refused (NotPermitted), never reported as done."""
        try:
            with self._sessions() as s, s.begin():
                yield s
        except StaleDataError as exc:
            raise unchanged("changing the ledger", str(exc).splitlines()[0]) from None

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction on a Core connection, without an ORM session: the worker's hot path."""
        with self.engine.begin() as conn:
            yield conn

    @contextmanager
    def commit_after(self, conn: Connection) -> Iterator[RowUpdater]:
        """The last writes of a `transaction()`, sent with its COMMIT: on PostgreSQL (psycopg) in one
        pipeline, so no statement waits for its reply. The tail then waits twice (the COMMIT, and
        the pipeline's closing sync, which psycopg always sends) instead of once per statement plus
        the COMMIT. An error in any of them is raised at the commit, which the transaction then
        rolls back whole, as it would one raised at its own statement. Nothing may be read inside,
        and nothing may follow it: the transaction has ended. Elsewhere (SQLite, another
        PostgreSQL driver) the statements run one by one and the transaction ends as usual.

        It yields `update_row(table, row_id, values, what)`, the UPDATE of one row by its id, which
        must change that row: row-level security filters an UPDATE it does not allow to zero rows,
        silently, and a transition so filtered must be refused, not reported done. Without the
        pipeline its row count is checked at once (NotPermitted); in the pipeline, where row counts
        come back only with the replies, the database checks it: the UPDATE runs inside a statement
        that calls `ggpo_changed(count, what)` (migration 0006), which raises insufficient_privilege
        unless one row changed, so the COMMIT fails and the transaction is rolled back whole, at no
        extra wait (NotPermitted too).

        After an error the connection is discarded, not returned to the pool: a pipeline aborted
        part-way can leave its session inside the transaction (seen once in 300 refused tails,
        the next user of the connection then failing with "connection in transaction status")."""
        if conn.dialect.driver != "psycopg":
            def update_row(table: Table, row_id: int, values: Mapping[str, Any], what: str) -> None:
                result = conn.execute(_row_update(table, tuple(values), guarded=False),
                                      {"row_id": row_id, **{f"v_{k}": v for k, v in values.items()}})
                expect_rows(result, 1, what)

            yield update_row
            return

        def guarded_row(table: Table, row_id: int, values: Mapping[str, Any], what: str) -> None:
            conn.execute(_row_update(table, tuple(values), guarded=True),
                         {"row_id": row_id, "what": what, **{f"v_{k}": v for k, v in values.items()}})

        committed = False
        try:
            with conn.connection.dbapi_connection.pipeline():  # type: ignore[union-attr]
                yield guarded_row
                conn.commit()
                committed = True
        except BaseException as exc:
            conn.invalidate()
            if committed and isinstance(exc, Exception):
                # The COMMIT was answered; only the pipeline's closing sync failed (the server went
                # away just then): the transition is written, and must not be retried as if it were not.
                log.warning("ledger: the connection failed after a commit (%s); the transaction is committed",
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                return
            if isinstance(exc, DBAPIError) and (refused := write_refused(exc)) is not None:
                raise refused from None
            raise

    @contextmanager
    def reading(self) -> Iterator[Connection]:
        """A read that needs no transaction of its own. On PostgreSQL an autocommit connection: each
        statement sees what is committed, without the BEGIN and COMMIT round trips a transaction
        adds (two of a one-statement read's three). SQLite's reads are local: a transaction."""
        if self.engine.dialect.name != "postgresql":
            with self.transaction() as conn:
                yield conn
            return
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            yield conn

    @contextmanager
    def exclusive(self, name: str) -> Iterator[None]:
        """Hold a lock named `name` across processes for a check-then-write that spans several
        transactions (the cost caps: two enqueues must not both fit under the same cap).

        PostgreSQL: a session advisory lock on a connection of its own. SQLite: an flock on a file
        beside the database (SQLite is one machine), or a process lock for an in-memory database.
        """
        if self.engine.dialect.name == "postgresql":
            key = func.hashtext(f"ggpo:{name}")
            with self.engine.connect() as conn:
                conn.execute(select(func.pg_advisory_lock(key)))
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(select(func.pg_advisory_unlock(key)))
                    conn.commit()
            return
        path = self.engine.url.database
        if not path or path == ":memory:":
            with _PROCESS_LOCKS.setdefault(name, threading.Lock()):
                yield
            return
        try:
            fh = open(f"{path}.{name}.lock", "a+")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:  # a read-only folder or lock file: one line, exit 4, not a traceback
            raise Unavailable(f"the ledger's lock file {path}.{name}.lock cannot be opened ({exc.strerror}); "
                              f"the ledger's folder must be writable") from None
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # -- internal helpers -------------------------------------------------------------------

    @staticmethod
    def _event(s: Session, *, entity: str, to_state: str, actor: str, from_state: str | None = None,
               reason: str | None = None, experiment_id: int | None = None, run: Run | None = None,
               attempt: Attempt | None = None, decision: Decision | None = None) -> None:
        """Append an event, and the notification it makes (if any), to this transaction."""
        attempt_id = attempt.id if attempt else None
        s.add(Event(**event_row(entity=entity, to_state=to_state, actor=actor, from_state=from_state, reason=reason,
                                experiment_id=experiment_id, run=run, attempt_id=attempt_id)))
        notice = notice_of(entity=entity, to_state=to_state, actor=actor, reason=reason, run=run,
                           attempt_id=attempt_id, decision=decision)
        if notice is not None:
            s.add(Notification(**notification_row(notice)))

    @staticmethod
    def _locked_run(s: Session, run_key: str) -> Run:
        run = s.scalars(select(Run).where(Run.run_key == run_key).with_for_update(of=Run)).unique().one_or_none()
        if run is None:
            raise missing_run(s.connection(), run_key)
        return run

    def _move(self, s: Session, run: Run, to: str, actor: str, reason: str | None,
              attempt: Attempt | None = None) -> None:
        check_move(run, to, reason)
        self._event(s, entity="run", from_state=run.state, to_state=to, actor=actor, reason=reason, run=run,
                    attempt=attempt)
        run.state = to
        run.updated_at = utcnow()


def unchanged(what: str, detail: str) -> NotPermitted:
    """The refusal of a write the database silently did not make (an UPDATE of zero rows)."""
    return NotPermitted(what, f"the database changed no row ({detail}): its row-level security does not let this "
                              f"role change it; nothing was written")


def expect_rows(result: CursorResult[Any], rows: int, what: str) -> None:
    """Refuse (NotPermitted) an UPDATE that changed another number of rows than `rows`."""
    if result.rowcount != rows:
        raise unchanged(what, f"{result.rowcount} of {rows} row(s) updated")


RowUpdater = Callable[[Table, int, Mapping[str, Any], str], None]


@functools.lru_cache(maxsize=64)
def _row_update(table: Table, columns: tuple[str, ...], *, guarded: bool) -> Executable:
    """UPDATE `table` SET `columns` (parameters `v_<column>`) WHERE id = :row_id; `guarded`: inside
    `SELECT ggpo_changed(count(*), :what) FROM (the UPDATE ... RETURNING 1)`. Built once per shape."""
    stmt = update(table).where(table.c.id == bindparam("row_id")).values(
        {c: bindparam(f"v_{c}", type_=table.c[c].type) for c in columns})
    if not guarded:
        return stmt
    changed = stmt.returning(literal_column("1")).cte("changed")
    return select(func.ggpo_changed(func.count(), bindparam("what", type_=String))).select_from(changed)


_RUN_OWNER = (select(Experiment.created_by, Experiment.name, func.session_user().label("role"))
              .join(Run, Run.experiment_id == Experiment.id))


def missing_run(conn: Connection, run_key: str) -> GgpoError:
    """The error for a run that a locking read (SELECT ... FOR UPDATE) did not return: absent
    (LedgerError), or there but hidden from this role's changes by row-level security, which applies
    its UPDATE policies to a locking read (NotPermitted: nothing is changed)."""
    if conn.dialect.name != "postgresql":
        return LedgerError(f"no run {run_key!r} in the ledger")
    row = conn.execute(_RUN_OWNER.where(Run.run_key == run_key)).one_or_none()
    if row is None:
        return LedgerError(f"no run {run_key!r} in the ledger")
    return NotPermitted(f"changing run {run_key}", f"it belongs to {row.created_by}'s experiment {row.name}, and the "
                        f"ledger's row-level security lets the PostgreSQL role {row.role!r} change only the runs of "
                        f"its own experiments (a lead: also of its teams' members; a service: all); nothing was "
                        f"changed")


def _wrap_public(cls: type) -> None:
    for name, value in list(vars(cls).items()):
        if (callable(value) and not name.startswith("_") and name not in ("session", "transaction", "exclusive")
                and not isinstance(value, staticmethod)):
            setattr(cls, name, _retrying(value))
