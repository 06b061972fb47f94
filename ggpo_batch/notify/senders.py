"""Send one notification to one sink, waiting at most `timeout` seconds for any step of it (connect,
each read and write): a webhook gets a Slack-compatible JSON body by POST, an e-mail goes through
an SMTP relay. The idempotency key travels with it (`Idempotency-Key` header, the JSON's `key`,
the e-mail's Message-ID), so a receiver that sees it twice can drop the second. Raises
`SendFailed` (one line, never the webhook's URL, which may carry a token) when the sink did not
take it."""

from __future__ import annotations

import json
import smtplib
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Any

from ..schemas import versioned
from .targets import NotifyTargets, Sink

USER_AGENT = "ggpo-batch-notify"
_MAX_REPLY = 64 << 10


class SendFailed(Exception):
    """The sink did not take the notification; the message says why in one line."""


def payload(n: Any) -> dict[str, Any]:
    """A notification as receivers get it: Slack's `text`, and the structured fields beside it."""
    return versioned("notification", {"text": n.subject, "kind": n.kind, "key": n.key,
                                      "created_at": n.created_at.isoformat(), "fields": dict(n.fields or {})})


def send(sink: Sink, n: Any, targets: NotifyTargets) -> None:
    """Deliver notification `n` to `sink` or raise SendFailed."""
    try:
        if sink.kind == "webhook":
            _post(sink.url or "", n, targets.timeout_seconds)
        else:
            _mail(n, targets)
    except SendFailed:
        raise
    except (OSError, smtplib.SMTPException, ssl.SSLError, ValueError) as exc:
        raise SendFailed(_why(exc)) from None


def _post(url: str, n: Any, timeout: float) -> None:
    body = json.dumps(payload(n), sort_keys=True, default=str).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Idempotency-Key": n.key, "User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # http(s) only: targets.py
            reply.read(_MAX_REPLY)
    except urllib.error.HTTPError as exc:
        raise SendFailed(f"HTTP {exc.code} {exc.reason}") from None


def _mail(n: Any, t: NotifyTargets) -> None:
    msg = EmailMessage()
    msg["From"] = t.email_from
    msg["To"] = ", ".join(t.email_to)
    msg["Subject"] = f"[ggpo-batch] {n.subject}"
    msg["Message-ID"] = f"<{n.key}@ggpo-batch>"
    msg["Date"] = format_datetime(n.created_at)
    msg["Idempotency-Key"] = n.key
    msg.set_content(_text(n.subject, n.kind, n.key, n.fields or {}))
    assert t.smtp_host is not None
    with smtplib.SMTP(t.smtp_host, t.smtp_port, timeout=t.timeout_seconds) as smtp:
        if t.smtp_starttls:
            smtp.starttls(context=ssl.create_default_context())
        if t.smtp_user and t.smtp_password:
            smtp.login(t.smtp_user, t.smtp_password)
        smtp.send_message(msg)


def _text(subject: str, kind: str, key: str, fields: Mapping[str, Any]) -> str:
    lines = [subject, "", f"event: {kind}"]
    lines += [f"{k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}" for k, v in fields.items()
              if v is not None]
    lines += ["", f"idempotency key: {key}", "(sent by ggpo-batch; `ggpo-batch notifications` lists what is pending)"]
    return "\n".join(lines) + "\n"


def _why(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(exc, urllib.error.URLError):
        return _why(exc.reason) if isinstance(exc.reason, BaseException) else str(exc.reason)
    if isinstance(exc, smtplib.SMTPResponseException):
        return f"SMTP {exc.smtp_code} {exc.smtp_error.decode(errors='replace') if isinstance(exc.smtp_error, bytes) else exc.smtp_error}"
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
