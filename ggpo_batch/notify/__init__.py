"""Notifications: events written to the ledger's outbox in the transaction that makes them
(`kinds`, `ledger/notifications.py`), or by reconcile once it sees them (`observe`), then delivered
at least once by reconcile (`delivery`) to webhooks and e-mail (`senders`), as configured
(`targets`). Nothing here is imported by a transition but `kinds`."""
