"""The ledger: the source of truth for experiments, runs, attempts, decisions and their events.

The only code that writes run and attempt state. Each transition runs in one transaction, locks
the row it changes, checks the move is allowed (`ggpo_batch.contracts.states`), and appends an `events`
row (who, when, from, to, why) in that same transaction.

The names below are imported on first use (PEP 562): importing `ggpo_batch.ledger.db` or
`.schema` does not import every part of `Ledger` and SQLAlchemy's ORM with them, so a command that
needs only the engine (`status` on an empty ledger, `db current`) starts without them.
"""

from __future__ import annotations

import threading
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import NewRun
    from .db import current_revision, downgrade, head_revision, upgrade
    from .quotas import QuotaExceeded

__all__ = [
    "Ledger",
    "NewRun",
    "QuotaExceeded",
    "connect",
    "current_revision",
    "downgrade",
    "head_revision",
    "upgrade",
]

_HOME = {"NewRun": ".core", "QuotaExceeded": ".quotas", "current_revision": ".db",
         "downgrade": ".db", "head_revision": ".db", "upgrade": ".db"}


def _ledger_class() -> type:
    from .attempts import AttemptTransitions
    from .canaries import CanaryRecords
    from .component_runs import ComponentRecords
    from .costs import CostRecords
    from .evaluation_rows import EvaluationRecords
    from .gauges import GaugeReads
    from .heartbeats import HeartbeatRecords
    from .looks import LookRecords
    from .notifications import NotificationRecords
    from .observations import ObservationRecords
    from .runs import RunTransitions
    from .summaries import RunSummaries

    class Ledger(RunTransitions, AttemptTransitions, CostRecords, ComponentRecords, RunSummaries, HeartbeatRecords,
                 NotificationRecords, EvaluationRecords,
                 ObservationRecords, GaugeReads, LookRecords, CanaryRecords):
        """The ledger on one database. Cheap to create; holds only an engine.

        Every public method is one transaction and is retried while the database is unreachable,
        for at most `retry_seconds` (default 120: a PostgreSQL restart does not lose a transition).
        """

    Ledger.__module__, Ledger.__qualname__ = __name__, "Ledger"
    return Ledger


_FIRST_USE = threading.RLock()  # two threads asking for Ledger at once get the same class


def __getattr__(name: str) -> Any:
    if name not in _HOME and name != "Ledger":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _FIRST_USE:
        if name not in globals():  # once: later lookups find it and do not come here
            globals()[name] = _ledger_class() if name == "Ledger" else getattr(import_module(_HOME[name], __name__),
                                                                                  name)
    return globals()[name]


def connect(url: str, *, check: bool = True, retry_seconds: float = 120.0,  # type: ignore[no-untyped-def]
            pre_ping: bool = True, reading: bool = False):
    """A Ledger on `url`; with `check`, refuse a schema that is not at head; with `reading`, one
    that only reads (`make_engine`)."""
    from .db import check_schema, make_engine

    engine = make_engine(url, pre_ping=pre_ping, reading=reading)
    if check:
        check_schema(engine)
    return __getattr__("Ledger")(engine, retry_seconds=retry_seconds)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # for type checkers: the class __getattr__ builds
    from .attempts import AttemptTransitions
    from .canaries import CanaryRecords
    from .component_runs import ComponentRecords
    from .costs import CostRecords
    from .evaluation_rows import EvaluationRecords
    from .gauges import GaugeReads
    from .heartbeats import HeartbeatRecords
    from .looks import LookRecords
    from .notifications import NotificationRecords
    from .observations import ObservationRecords
    from .runs import RunTransitions
    from .summaries import RunSummaries

    class Ledger(RunTransitions, AttemptTransitions, CostRecords, ComponentRecords, RunSummaries,
                 HeartbeatRecords, NotificationRecords, EvaluationRecords,
                 ObservationRecords, GaugeReads, LookRecords, CanaryRecords): ...
