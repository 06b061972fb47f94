"""Reconcile's notification step: record what it observes, then deliver what is due. It never
raises: a notification problem is logged and left for the next pass, and never stops the
reconcile of runs it follows."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .delivery import deliver_due
from .observe import observe

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..ledger import Ledger

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NotifyReport:
    recorded: int = 0  # notices this pass observed for the first time
    delivered: int = 0
    failed_tries: int = 0


def notify_cycle(ledger: Ledger, settings: Settings) -> NotifyReport:
    """Observe, then deliver (see ggpo_batch/notify/). Errors are logged, never raised."""
    recorded = delivered = failed = 0
    try:
        recorded = observe(ledger, settings)
    except Exception:  # a notification never fails the reconcile of runs
        log.exception("notifications: observing failed; the next pass tries again")
    try:
        rep = deliver_due(ledger, settings.notify)
        delivered, failed = rep.delivered, rep.failed_tries
    except Exception:
        log.exception("notifications: delivering failed; the next pass tries again")
    return NotifyReport(recorded, delivered, failed)
