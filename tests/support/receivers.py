"""Real receivers on 127.0.0.1 for the notification tests: an HTTP server (threaded http.server)
and an SMTP server (aiosmtpd), each recording what it got with the idempotency key it carried,
and a "black hole" that accepts connections and never answers (a sink that hangs)."""

from __future__ import annotations

import email
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Received:
    """What a receiver got: (idempotency key, document) per delivery, duplicates included."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, key: str, doc: Any) -> None:
        with self._lock:
            self.items.append((key, doc))

    @property
    def keys(self) -> list[str]:
        with self._lock:
            return [k for k, _ in self.items]


class HttpReceiver:
    """A webhook receiver on `port`; `delay` seconds before it answers (longer than the sender's
    timeout: it got the notice, the sender does not know, and sends it again)."""

    def __init__(self, port: int, received: Received, *, delay: float = 0.0) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.add(self.headers.get("Idempotency-Key", ""), json.loads(body))
                time.sleep(outer.delay)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.delay = delay
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    """An SMTP server (aiosmtpd) on `port` that keeps each message's Message-ID."""

    def __init__(self, port: int, received: Received) -> None:
        from aiosmtpd.controller import Controller

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                msg = email.message_from_bytes(envelope.content)
                key = (msg["Message-ID"] or "").strip("<>").removesuffix("@ggpo-batch")
                received.add(key, {"subject": msg["Subject"], "to": envelope.rcpt_tos, "body": msg.get_payload()})
                return "250 OK"

        self.controller = Controller(Handler(), hostname="127.0.0.1", port=port)
        self.controller.start()

    def stop(self) -> None:
        self.controller.stop()


class BlackHole:
    """Accepts connections on `port` and never sends a byte (counts them). `held` has, for each
    connection the client closed, how long it held it open: what a client's timeout cost it,
    measured where the wait happens rather than by the caller's wall clock (which a busy machine
    stretches with everything else the caller does)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.accepted: list[socket.socket] = []
        self.held: list[float] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted.append(conn)
            threading.Thread(target=self._until_closed, args=(conn, time.monotonic()), daemon=True).start()

    def _until_closed(self, conn: socket.socket, since: float) -> None:
        conn.settimeout(None)  # blocking: a read ends when the client closes
        try:
            while conn.recv(4096):  # b"": the client closed its end
                pass
        except OSError:  # closed here by stop(), or reset by the client
            return
        self.held.append(time.monotonic() - since)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        for c in self.accepted:
            c.close()
        self.sock.close()


@contextmanager
def stopping(*things: Any) -> Iterator[None]:
    try:
        yield
    finally:
        for t in things:
            if t is not None:
                t.stop()
