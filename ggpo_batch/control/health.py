"""Health: is this service's ledger reachable and at the head revision, and its Redis reachable?

What `/healthz` answers on the dashboard and on a worker's metrics port: 200 with every check
passed, else 503, with a JSON body naming each check and what failed. The body names no secret:
no URL, no host, no exception text (which may quote a URL), only the kind of failure and, for the
ledger, the revisions (Alembic ids the code ships anyway). Each check is bounded in time, so a
probe never hangs on a service that accepts connections and never answers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..config.settings import MEMORY_REDIS
from ..errors import SchemaBehindError
from ..ledger.db import current_revision, head_revision

log = logging.getLogger(__name__)

REDIS_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Health:
    """Every check by name -> {"ok": bool, ...}; `ok` when all passed."""

    checks: dict[str, dict[str, Any]]

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks.values())

    @property
    def status_code(self) -> int:
        return 200 if self.ok else 503

    def document(self) -> dict[str, Any]:
        failed = [name for name, c in self.checks.items() if not c["ok"]]
        return {"status": "ok" if not failed else "failing", "failed": failed, "checks": self.checks}


def ledger_check(engine: Engine) -> dict[str, Any]:
    """The ledger answers and is at the revision this code needs."""
    head = head_revision()
    try:
        revision = current_revision(engine)
    except SchemaBehindError:  # several revisions at once
        return {"ok": False, "reachable": True, "problem": "several revisions", "head": head}
    except Exception as exc:  # noqa: BLE001  (any failure to answer is "unreachable"; its text may hold a URL)
        log.warning("health: ledger unreachable: %s", type(exc).__name__)
        return {"ok": False, "reachable": False, "problem": f"unreachable ({type(exc).__name__})", "head": head}
    if revision != head:
        return {"ok": False, "reachable": True, "revision": revision, "head": head,
                "problem": "no ledger schema" if revision is None else f"at revision {revision}, not {head}"}
    return {"ok": True, "reachable": True, "revision": revision, "head": head}


def redis_check(redis_url: str) -> dict[str, Any]:
    """Redis answers a PING (memory://, the in-process queue, always does)."""
    if redis_url == MEMORY_REDIS:
        return {"ok": True, "reachable": True, "inline": True}
    from redis import Redis

    client = None
    try:
        client = Redis.from_url(redis_url, socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # noqa: BLE001  (its text may quote the URL)
        log.warning("health: Redis unreachable: %s", type(exc).__name__)
        return {"ok": False, "reachable": False, "problem": f"unreachable ({type(exc).__name__})"}
    finally:
        if client is not None:
            client.close()
    return {"ok": True, "reachable": True}


def check(engine: Engine, redis_url: str) -> Health:
    """Both checks, the ledger's on `engine` and Redis' at `redis_url`."""
    return Health({"ledger": ledger_check(engine), "redis": redis_check(redis_url)})
