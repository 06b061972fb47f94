"""A worker's metrics port (`worker --metrics-port N`): `/metrics` and `/healthz` over plain HTTP.

`/metrics`: the worker's own counters and histograms (common/metrics.py), summed with what the
processes forked from it counted (prometheus_client's multiprocess mode, in a folder of the worker's
own: `MetricsPort.open` makes it and `close` removes it). The ledger's figures are not here: the
dashboard exposes them once for the team. `/healthz`: control/health.py, 200 or 503 with JSON.
Neither names a secret, so neither needs a token; the port binds 127.0.0.1 unless `--metrics-host`
says otherwise. Served from threads of the worker's process (the standard library's server).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import Engine

from ..common import metrics

log = logging.getLogger(__name__)


class MetricsPort:
    """The HTTP server of a worker's metrics, on its own daemon thread."""

    def __init__(self, server: ThreadingHTTPServer, directory: str) -> None:
        self.server = server
        self.directory = directory
        self.thread = threading.Thread(target=server.serve_forever, name="metrics-port", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @classmethod
    def open(cls, host: str, port: int, *, engine: Engine, redis_url: str) -> MetricsPort:
        """Count in a fresh multiprocess folder from now on and serve on (host, port)."""
        directory = tempfile.mkdtemp(prefix="ggpo-worker-metrics-")
        metrics.use_directory(directory)
        metrics.declare_all()
        handler = type("Handler", (_Handler,), {"engine": engine, "redis_url": redis_url})
        try:
            server = ThreadingHTTPServer((host, port), handler)
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        server.daemon_threads = True
        opened = cls(server, directory)
        opened.thread.start()
        log.warning("worker metrics on http://%s:%d/metrics (and /healthz)", host, opened.port)
        return opened

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        metrics.use_directory(None)
        shutil.rmtree(self.directory, ignore_errors=True)


@contextmanager
def served(at: tuple[str, int] | None, *, engine: Engine, redis_url: str) -> Iterator[MetricsPort | None]:
    """The metrics port on `at` (host, port) while the block runs; nothing when `at` is None."""
    if at is None:
        yield None
        return
    port = MetricsPort.open(*at, engine=engine, redis_url=redis_url)
    try:
        yield port
    finally:
        port.close()


class _Handler(BaseHTTPRequestHandler):
    engine: Engine
    redis_url: str
    server_version = "ggpo-batch"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, content_type = metrics.exposition()
            self._reply(200, body, content_type)
        elif path == "/healthz":
            from .health import check

            health = check(self.engine, self.redis_url)
            self._reply(health.status_code, (json.dumps(health.document(), sort_keys=True) + "\n").encode(),
                        "application/json")
        else:
            self._reply(404, b"not found: /metrics or /healthz\n", "text/plain; charset=utf-8")

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return
