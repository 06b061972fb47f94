"""The ledger: the source of truth for experiments, runs, attempts, decisions and their events."""

from .db import connect, upgrade, downgrade, current_revision, head_revision
from .ledger import Ledger

__all__ = ["Ledger", "connect", "upgrade", "downgrade", "current_revision", "head_revision"]
