"""The ledger: the source of truth for experiments, runs, attempts, decisions and their events.

The only code that writes run and attempt state. Each transition runs in one transaction, locks
the row it changes, checks the move is allowed (`ggpo_batch.states`), and appends an `events`
row (who, when, from, to, why) in that same transaction.
"""

from .attempts import AttemptTransitions, QuotaExceeded
from .component_runs import ComponentRecords
from .core import NewRun
from .costs import CostRecords
from .db import connect, current_revision, downgrade, head_revision, upgrade
from .heartbeats import HeartbeatRecords
from .runs import RunTransitions
from .summaries import RunSummaries


class Ledger(RunTransitions, AttemptTransitions, CostRecords, ComponentRecords, RunSummaries, HeartbeatRecords):
    """The ledger on one database. Cheap to create; holds only an engine.

    Every public method is one transaction and is retried while the database is unreachable,
    for at most `retry_seconds` (default 120: a PostgreSQL restart does not lose a transition).
    """


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
