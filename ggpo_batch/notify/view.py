"""`ggpo-batch notifications`: what the outbox has not delivered yet, and each sink's health, so
an operator sees a dead sink. Pure data (dicts) for a table or JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config.notify_targets import NotifyTargets

if TYPE_CHECKING:
    from ..ledger import Ledger


def _time(at: Any) -> str | None:
    return at.isoformat(timespec="seconds") if at is not None else None


def notifications_view(ledger: Ledger, targets: NotifyTargets, *, everything: bool = False,
                       limit: int = 100) -> dict[str, Any]:
    """{"counts", "sinks", "notifications"}: the notifications still due or failed somewhere (with
    `everything`, delivered ones too), newest first; per sink its deliveries' states and last error."""
    rows = ledger.notifications(undelivered=not everything, limit=limit)
    configured = {s.name for s in targets.sinks()}
    summary = ledger.sink_summary()
    sinks = []
    for name in sorted(configured | set(summary)):
        s = summary.get(name, {"delivered": 0, "retrying": 0, "failed": 0, "next_try_at": None, "last_error": None})
        sinks.append({"name": name, "configured": name in configured, **s, "next_try_at": _time(s["next_try_at"])})
    out = [{"key": n.key, "kind": n.kind, "subject": n.subject, "created_at": _time(n.created_at),
            "next_try_at": _time(n.next_try_at),
            "deliveries": [{"sink": d.sink, "state": d.state, "tries": d.tries, "next_try_at": _time(d.next_try_at),
                            "last_error": d.last_error, "delivered_at": _time(d.delivered_at)}
                           for d in deliveries.values()]} for n, deliveries in rows]
    return {"counts": dict(ledger.notification_counts()), "sinks": sinks, "notifications": out}
