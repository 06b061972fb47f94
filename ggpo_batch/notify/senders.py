"""Send one notification to one sink, waiting at most `timeout` seconds for any step of it (connect,
each read and write): a webhook gets a Slack-compatible JSON body by POST, an e-mail goes through
an SMTP relay. The idempotency key travels with it (`Idempotency-Key` header, the JSON's `key`,
the e-mail's Message-ID), so a receiver that sees it twice can drop the second. Raises
`SendFailed` (one line, never the webhook's URL, which may carry a token) when the sink did not
take it.

No redirect is followed (a 3xx answer is a failure naming its status): a receiver that moved would
otherwise turn the POST into a GET to wherever it points (a metadata service) and be booked
delivered. A webhook URL's `user:password@` is sent as HTTP Basic auth, never as part of the host.
Every secret the sink knows (the SMTP password, the webhook URL, its password and path) is masked in
the failure's text before anyone stores or prints it: a server may quote them back."""

from __future__ import annotations

import base64
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
from urllib.parse import unquote, urlsplit, urlunsplit

from ..common import schemas
from ..config.notify_targets import NotifyTargets, Sink

USER_AGENT = "ggpo-batch-notify"
_MAX_REPLY = 64 << 10


class SendFailed(Exception):
    """The sink did not take the notification; the message says why in one line."""


def payload(n: Any) -> dict[str, Any]:
    """A notification as receivers get it: Slack's `text`, and the structured fields beside it."""
    return schemas.versioned("notification", {"text": n.subject, "kind": n.kind, "key": n.key,
                                      "created_at": n.created_at.isoformat(), "fields": dict(n.fields or {})})


def send(sink: Sink, n: Any, targets: NotifyTargets) -> None:
    """Deliver notification `n` to `sink` or raise SendFailed (its text masked: `sink_secrets`)."""
    try:
        if sink.kind == "webhook":
            _post(sink.url or "", n, targets.timeout_seconds)
        else:
            _mail(n, targets)
    except SendFailed as exc:
        raise SendFailed(mask(str(exc), sink_secrets(sink, targets))) from None
    except (OSError, smtplib.SMTPException, ssl.SSLError, ValueError) as exc:
        raise SendFailed(mask(_why(exc), sink_secrets(sink, targets))) from None


def sink_secrets(sink: Sink, targets: NotifyTargets) -> list[str]:
    """What a server may quote back that nobody may read: the SMTP password (also as AUTH sends it,
    base64), a webhook's URL, its password and its path and query (a Slack URL's token)."""
    out: list[str] = []
    if sink.kind == "email" and targets.smtp_password:
        pw, user = targets.smtp_password, targets.smtp_user or ""
        out += [pw, base64.b64encode(pw.encode()).decode(),
                base64.b64encode(f"\0{user}\0{pw}".encode()).decode()]
    if sink.kind == "webhook" and sink.url:
        parts = urlsplit(sink.url)
        out += [sink.url, urlunsplit(parts._replace(netloc=parts.hostname or ""))]
        if parts.password:
            out += [parts.password, unquote(parts.password)]
        tail = parts.path + (f"?{parts.query}" if parts.query else "")
        if len(tail) > 1:
            out += [tail, unquote(tail), *(seg for seg in tail.split("/") if len(seg) >= 8)]
    return [s for s in out if len(s) >= 4]


def mask(text: str, secrets: list[str]) -> str:
    """`text` with each of `secrets` replaced by ***, longest first."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Follow no redirect: urllib then raises the 3xx as an HTTPError."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _post(url: str, n: Any, timeout: float) -> None:
    body = json.dumps(payload(n), sort_keys=True, default=str).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": n.key, "User-Agent": USER_AGENT}
    parts = urlsplit(url)
    if parts.username is not None:  # user:password@ is HTTP Basic auth, not part of the host
        basic = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(basic).decode()
        netloc = parts.netloc.rpartition("@")[2]
        url = urlunsplit(parts._replace(netloc=netloc))
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout) as reply:  # http(s) only: targets.py
            reply.read(_MAX_REPLY)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise SendFailed(f"HTTP {exc.code} {exc.reason}: a redirect, not followed") from None
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
