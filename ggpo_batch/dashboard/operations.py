"""The dashboard's routes for operators' tools: `/metrics` (Prometheus' text format: the ledger's
figures, read at scrape time by reporting/ledger_metrics.py; behind the token like every page) and
`/healthz` (control/health.py: ledger reachable and at head, Redis reachable; open without the
token, access.OPEN_PATHS, and naming no secret)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..config.settings import Settings
from ..ledger import Ledger

_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def operation_routes(ledger: Ledger, settings: Settings) -> list[Route]:
    """`/metrics` and `/healthz` over `ledger` and the Redis of `settings`."""
    from ..reporting.ledger_metrics import LedgerCollector, exposition

    # Not retried (the pages wait for the ledger, a scrape does not): a ledger away is ggpo_ledger_up 0 now,
    # within Prometheus' scrape timeout, rather than a scrape that times out.
    once = type(ledger)(ledger.engine, retry_seconds=0)
    collector = LedgerCollector(once, default_queue=settings.queue, last_reconcile=_last_reconcile(settings))

    def metrics(_request: Request) -> Response:
        body, content_type = exposition(collector)
        return Response(body, media_type=content_type, headers=_NO_STORE)

    def healthz(_request: Request) -> Response:
        from ..control.health import check

        health = check(ledger.engine, settings.redis_url)
        return Response(json.dumps(health.document(), sort_keys=True) + "\n", status_code=health.status_code,
                        media_type="application/json", headers=_NO_STORE)

    return [Route("/metrics", metrics), Route("/healthz", healthz)]


def _last_reconcile(settings: Settings) -> Any:
    if settings.inline_queue:
        return None  # memory://: no worker, no reconcile

    def read() -> float | None:
        from redis import Redis

        from ..control.health import REDIS_TIMEOUT_S
        from ..control.reconcile import last_reconcile

        client = Redis.from_url(settings.redis_url, socket_connect_timeout=REDIS_TIMEOUT_S,
                                socket_timeout=REDIS_TIMEOUT_S)
        try:
            return last_reconcile(client)
        finally:
            client.close()

    return read
