"""Round 3's surface under hostile input (issue 42): webhook URLs refused when read, no redirect
followed, no secret a sink knows in a stored delivery error."""

from __future__ import annotations

import socketserver
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common.netutil import free_port
from ggpo_batch.config.notify_targets import NotifyTargets
from ggpo_batch.notify.delivery import deliver_due
from ggpo_batch.notify.senders import SendFailed, send
from tests.test_notifications import _experiment, _ran, _settings

BAD_URLS = ["http://[::1", "file:///etc/passwd", "gopher://h/x", "ftp://h/x", "dict://h:11111/x",
            "javascript:alert(1)", "//host/x", "http:///nohost", "http://h:99999/x", "http://h:port/x"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_webhook_url_is_refused_when_read_naming_the_setting(env: dict[str, str], tmp_path: Path, url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """From the environment and from webhook_urls_file: exit 2, one line naming the setting, the URL
    masked (its path never shown), no traceback."""
    marked = url + ("/TOKENxyz123" if "nohost" not in url and "[" not in url else "")
    monkeypatch.setenv("GGPO_NOTIFY_WEBHOOK_URLS", f"https://ok.example.org/a,{marked}")
    res = CliRunner().invoke(cli, ["status"])
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert "GGPO_NOTIFY_WEBHOOK_URLS: webhook 2 (" in res.output and "TOKENxyz123" not in res.output, res.output
    monkeypatch.delenv("GGPO_NOTIFY_WEBHOOK_URLS")
    urls = tmp_path / "hooks"
    urls.write_text(f"https://ok.example.org/a\n{marked}\n")
    urls.chmod(0o600)
    monkeypatch.setenv("GGPO_NOTIFY_WEBHOOK_URLS_FILE", str(urls))
    res = CliRunner().invoke(cli, ["status"])
    assert res.exit_code == 2 and len(res.output.splitlines()) == 1, res.output
    assert f"GGPO_NOTIFY_WEBHOOK_URLS_FILE={urls}: webhook 2 (" in res.output and "TOKENxyz123" not in res.output


def _notice() -> Any:
    return SimpleNamespace(subject="s", kind="run_failed", key="k.1", created_at=datetime.now(UTC), fields={})


class _Redirector:
    """Answers every request with `status` and a Location pointing at `to`."""

    def __init__(self, port: int, status: int, to: str) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(status)
                self.send_header("Location", to)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_no_redirect_is_followed(status: int) -> None:
    """A 3xx is a delivery failure naming its status; the address it points at gets nothing."""
    hit: list[str] = []

    class Meta(BaseHTTPRequestHandler):  # a stand-in for 169.254.169.254
        def do_GET(self) -> None:
            hit.append("GET")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    meta_port, port = free_port(), free_port()
    meta = ThreadingHTTPServer(("127.0.0.1", meta_port), Meta)
    threading.Thread(target=meta.serve_forever, daemon=True).start()
    redirector = _Redirector(port, status, f"http://127.0.0.1:{meta_port}/latest/meta-data/")
    targets = NotifyTargets(webhook_urls=(f"http://127.0.0.1:{port}/hook",), timeout_seconds=2.0)
    try:
        with pytest.raises(SendFailed, match=f"HTTP {status} .*a redirect, not followed"):
            send(targets.sinks()[0], _notice(), targets)
    finally:
        redirector.stop()
        meta.shutdown()
        meta.server_close()
    assert hit == []


def test_user_password_in_a_webhook_url_is_sent_as_basic_auth() -> None:
    port = free_port()
    got: list[str] = []

    class H(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            got.append(self.headers.get("Authorization", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    targets = NotifyTargets(webhook_urls=(f"http://hook%40user:pa%3Ass@127.0.0.1:{port}/hook",), timeout_seconds=2.0)
    try:
        send(targets.sinks()[0], _notice(), targets)
    finally:
        server.shutdown()
        server.server_close()
    import base64
    assert got == ["Basic " + base64.b64encode(b"hook@user:pa:ss").decode()]


PASSWORD = "S3cretPW-quoted"


class _QuotingRelay(socketserver.StreamRequestHandler):
    """An SMTP relay that refuses the login quoting what it was sent and the password."""

    def handle(self) -> None:
        self.wfile.write(b"220 relay ESMTP\r\n")
        for line in self.rfile:
            cmd = line.decode(errors="replace").strip()
            if cmd.upper().startswith("EHLO"):
                self.wfile.write(b"250-relay\r\n250 AUTH PLAIN\r\n")
            elif cmd.upper().startswith("AUTH"):
                self.wfile.write(f"535 5.7.8 bad credentials {cmd} password {PASSWORD}\r\n".encode())
            elif cmd.upper().startswith("QUIT"):
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


def test_a_relay_quoting_the_password_never_gets_it_stored(ledger, db_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The delivery error booked in the ledger (what `notifications` shows any reader, and reconcile
    logs) has the password, and AUTH's base64 of it, masked."""
    [key] = _experiment(ledger, "quoted", range(1, 2))
    _ran(ledger, key)
    ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason="x")
    port = free_port()
    relay = socketserver.ThreadingTCPServer(("127.0.0.1", port), _QuotingRelay)
    relay.daemon_threads = True
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    settings = _settings(db_url, tmp_path, smtp_host="127.0.0.1", smtp_port=str(port), email_to="a@example.org",
                         smtp_user="batch", smtp_password=PASSWORD, timeout_seconds="2")
    try:
        rep = deliver_due(ledger, settings.notify)
    finally:
        relay.shutdown()
        relay.server_close()
    assert rep.failed_tries == 1
    errors = [d.last_error for _, ds in ledger.notifications(undelivered=False) for d in ds.values()]
    assert errors and all(e and "SMTP 535" in e and "***" in e for e in errors), errors
    assert not any(PASSWORD in e or "UzNjcmV0UFctcXVvdGVk" in e or "AGJhdGNoAFMzY3JldFBXLXF1b3RlZA==" in e
                   for e in errors), errors


FORGED = "\x1b[2J\x1b[31mpwned\nfake: line\x07"


def test_a_forged_revision_string_is_printed_escaped(env: dict[str, str], db_url: str) -> None:
    """A ledger from elsewhere whose alembic_version holds terminal escape codes and a newline: `db
    upgrade`, `db current` and `status` print it escaped, on one line."""
    from sqlalchemy import text

    from ggpo_batch.ledger.db import make_engine

    assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": FORGED})
    engine.dispose()
    for args in (["db", "upgrade"], ["status"], ["db", "current"]):
        res = CliRunner().invoke(cli, args)
        assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
        assert "\x1b" not in res.output and "\x07" not in res.output and "pwned\nfake" not in res.output, res.output
        assert "\\x1b[2J" in res.output or res.exit_code == 0, (args, res.output)


def test_strings_read_from_a_ledger_are_printed_escaped(ledger, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """A ledger from elsewhere: a run's reason, an actor, a decision's reason holding escape codes and a
    line break reach no terminal raw, whichever command prints them (rich tables and plain lines)."""
    from ggpo_batch.contracts.states import KIND_NOT_REPRODUCED
    from tests.test_notifications import _runs

    [run] = _runs("forged", range(1, 2))
    key = run.run_key
    ledger.create_experiment(name="forged", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor=FORGED, runs=[run])
    ledger.begin_attempt(key, executor="local", gpus=4, actor="w", worker="w1")
    ledger.mark_submitted(key, 1, job_id="101", actor="w")
    ledger.mark_running(key, 1, actor="w")
    ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason=FORGED,
                         gpu_hours_job=0.5)
    ledger.record_decision(experiment_name="forged", kind=KIND_NOT_REPRODUCED, actor="tester", reason=FORGED,
                           estimated_gpu_hours=3.0)
    for args in (["status"], ["status", "--runs"], ["report", "forged"], ["costs", "--by", "user"],
                 ["report", "forged", "--format", "md"]):
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, (args, res.output)
        assert "\x1b" not in res.output and "\x07" not in res.output and "pwned\nfake" not in res.output, (args, res.output)
    assert "\\x1b[2J" in CliRunner().invoke(cli, ["status", "--runs"]).output


def test_the_terminal_stream_escapes_what_a_field_did_not() -> None:
    """The last line of defence (config.masking.MaskedText): a command's plain write with an escape
    code reaches the terminal escaped, its own line breaks kept; rich's stream keeps its styles."""
    import io

    from ggpo_batch.config.masking import MaskedText, layout_stream

    raw = io.StringIO()
    MaskedText(raw).write(f"reason: {FORGED}\nnext line\n")
    assert raw.getvalue() == "reason: \\x1b[2J\\x1b[31mpwned\nfake: line\\x07\nnext line\n"
    styled = io.StringIO()
    layout_stream(MaskedText(styled)).write("\x1b[1mbold\x1b[0m\n")
    assert styled.getvalue() == "\x1b[1mbold\x1b[0m\n"
