"""Deliver what the outbox holds, at least once, in bounded time: reconcile's share of notifying.

A pass takes the notifications that are due (at most `max_per_pass`), claims each (so two
reconcilers do not send it at once), and sends it to every sink that should get it and does not
have it yet. A failed try is retried after `retry_seconds`, doubling up to an hour, until
`give_up_seconds` after the event (then the delivery is `failed`, and `ggpo-batch notifications`
shows it). A dead sink costs a pass at most one try of `timeout_seconds`: once a sink fails it is
left alone for the rest of the pass, and until its back-off ends it is tried for one notice only.
Nothing here runs inside a transition: a run's own work never waits for a sink.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..config.notify_targets import NotifyTargets, Sink
from ..ledger.notifications import DeliveryOutcome
from ..ledger.schema import Notification, NotificationDelivery, utcnow
from .senders import SendFailed, send

if TYPE_CHECKING:
    from ..ledger import Ledger

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 3600.0
# A pass starts no new notification after this many timeouts' worth of time.
PASS_BUDGET_TIMEOUTS = 2


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed_tries: int = 0
    gave_up: int = 0
    deferred: int = 0  # deliveries left for a sink in back-off
    sinks_down: set[str] = field(default_factory=set)


def backoff(tries: int, first: float) -> timedelta:
    """How long after its `tries`-th failed try a delivery is tried again."""
    return timedelta(seconds=min(first * 2 ** max(tries - 1, 0), MAX_BACKOFF_SECONDS))


def deliver_due(ledger: Ledger, targets: NotifyTargets, *, now: datetime | None = None) -> DeliveryReport:
    """One delivery pass over the due notifications (see the module's docstring)."""
    rep = DeliveryReport()
    sinks = targets.sinks()
    if not sinks:
        return rep  # recorded, not sent: a sink configured later gets what is younger than give_up_seconds
    started = time.monotonic()
    now = now or utcnow()
    down = dict(ledger.sinks_down_until([s.name for s in sinks], now))
    if len(down) == len(sinks):
        return rep  # every sink in back-off: nothing can be sent before the first of them ends
    lease = timedelta(seconds=targets.timeout_seconds * (len(sinks) + 1) + 60)
    for n, deliveries in ledger.due_notifications(now, targets.max_per_pass):
        if time.monotonic() - started > PASS_BUDGET_TIMEOUTS * targets.timeout_seconds:
            break
        if not ledger.claim_notification(n.id, now=now, until=now + lease):
            continue
        outcomes, pending = [], []
        for sink in sinks:
            if n.kind not in sink.events:
                continue
            outcome, next_at = _one(sink, n, deliveries.get(sink.name), targets, down, rep)
            if outcome is not None:
                outcomes.append(outcome)
            if next_at is not None:
                pending.append(next_at)
        ledger.save_deliveries(n.id, outcomes, min(pending) if pending else None)
    return rep


def _one(sink: Sink, n: Notification, had: NotificationDelivery | None, targets: NotifyTargets, down: dict[str, datetime],
         rep: DeliveryReport) -> tuple[DeliveryOutcome | None, datetime | None]:
    """Try (or not) one sink for one notification: (what to book, when it is next due or None)."""
    if had is not None and had.state in ("delivered", "failed"):
        return None, None
    tries = had.tries if had is not None else 0
    now = utcnow()
    if had is not None and had.next_try_at is not None and had.next_try_at > now:
        return None, had.next_try_at
    if now - n.created_at > timedelta(seconds=targets.give_up_seconds):
        rep.gave_up += 1
        why = (had.last_error if had is not None else None) or "never tried"
        log.warning("notification %s: gave up on %s after %d tries (%s)", n.key, sink.name, tries, why)
        return DeliveryOutcome(sink.name, "failed", tries, None, f"gave up after {tries} tries: {why}"), None
    if sink.name in down:
        rep.deferred += 1
        return None, down[sink.name]
    try:
        send(sink, n, targets)
    except SendFailed as exc:
        tries += 1
        rep.failed_tries += 1
        rep.sinks_down.add(sink.name)
        again = utcnow() + backoff(tries, targets.retry_seconds)
        down[sink.name] = again  # the rest of this pass leaves it alone
        log.warning("notification %s to %s failed (try %d): %s; next try at %s", n.key, sink.name, tries, exc,
                    again.isoformat(timespec="seconds"))
        return DeliveryOutcome(sink.name, "retrying", tries, again, str(exc)), again
    rep.delivered += 1
    return DeliveryOutcome(sink.name, "delivered", tries + 1, None, None, utcnow()), None
