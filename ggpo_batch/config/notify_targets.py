"""Where notifications go and how hard delivery tries: `GGPO_NOTIFY_*` (or the `[notify]` table of a
settings file), read once into `NotifyTargets` by `config.load_settings`.

Sinks: webhooks (`webhook_urls`, comma-separated; a Slack incoming-webhook URL is a credential, so
the list comes from the environment or from `webhook_urls_file`, a 0600 file with one URL a line)
and e-mail through an SMTP relay (`smtp_host`, `smtp_port`, `smtp_starttls`, `smtp_user` with
`smtp_password` or `smtp_password_file`, `email_from`, `email_to`). `webhook_events` and
`email_events` pick the kinds each gets (default: all, `notify.kinds.KINDS`). Delivery: each try
waits at most `timeout_seconds` for a sink; a failed one is tried again after `retry_seconds`,
doubling up to an hour, until `give_up_seconds` after the event; a reconcile pass makes at most
`max_per_pass` deliveries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..contracts.notices import KINDS
from ..errors import ConfigError

_P = "GGPO_NOTIFY_"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Sink:
    """One place notifications are delivered to; `name` is stable while its settings are."""

    name: str
    kind: str  # webhook | email
    events: frozenset[str]
    url: str | None = None  # a webhook's


@dataclass(frozen=True)
class NotifyTargets:
    """Sinks and delivery bounds (field `x` is GGPO_NOTIFY_X)."""

    webhook_urls: tuple[str, ...] = ()
    webhook_events: tuple[str, ...] = KINDS
    smtp_host: str | None = None
    smtp_port: int = 25
    smtp_starttls: bool = False
    smtp_user: str | None = None
    smtp_password: str | None = None
    email_from: str = "ggpo-batch@localhost"
    email_to: tuple[str, ...] = ()
    email_events: tuple[str, ...] = KINDS
    timeout_seconds: float = 5.0
    retry_seconds: float = 30.0
    give_up_seconds: float = 86400.0
    max_per_pass: int = 20

    def sinks(self) -> list[Sink]:
        """The configured sinks, webhooks first."""
        out = [Sink(f"webhook:{urlsplit(u).hostname}:{_digest(u)}", "webhook", frozenset(self.webhook_events), u)
               for u in self.webhook_urls]
        if self.smtp_host and self.email_to:
            out.append(Sink(f"email:{self.smtp_host}:{_digest(self.smtp_host, self.smtp_port, *self.email_to)}",
                            "email", frozenset(self.email_events)))
        return out


def _digest(*parts: object) -> str:
    return hashlib.sha256("\n".join(map(str, parts)).encode()).hexdigest()[:8]


def notify_targets(env: Mapping[str, str], read_private: Callable[[str, str], str]) -> NotifyTargets:
    """The notification settings of `env` (no sink set: notifications are recorded, not sent);
    `read_private(SETTING, path)` reads a 0600 secrets file (`config.private_file_text`). Every name
    is read, whatever is set, so a settings file knows them all (`config.setting_names`)."""
    raw = {name: env.get(_P + name.upper(), "").strip() for name in NotifyTargets.__dataclass_fields__}
    files = {name: env.get(f"{_P}{name.upper()}_FILE", "").strip() for name in ("webhook_urls", "smtp_password")}
    urls_from = f"{_P}WEBHOOK_URLS"
    for name, path in files.items():
        if path and not raw[name]:
            raw[name] = read_private(f"{_P}{name.upper()}_FILE", path)
            if name == "webhook_urls":
                urls_from = f"{_P}WEBHOOK_URLS_FILE={path}"
    t = NotifyTargets(
        webhook_urls=_urls(raw["webhook_urls"], urls_from),  # never shown: a sink is named by its host and a digest
        webhook_events=_events("webhook_events", raw["webhook_events"]),
        smtp_host=raw["smtp_host"] or None,
        smtp_port=_number("smtp_port", raw["smtp_port"], 25, int, 1, 65535),
        smtp_starttls=_flag("smtp_starttls", raw["smtp_starttls"]),
        smtp_user=raw["smtp_user"] or None,
        smtp_password=raw["smtp_password"] or None,
        email_from=raw["email_from"] or NotifyTargets.email_from,
        email_to=_list(raw["email_to"]),
        email_events=_events("email_events", raw["email_events"]),
        timeout_seconds=_number("timeout_seconds", raw["timeout_seconds"], 5.0, float, 0.05, 300),
        retry_seconds=_number("retry_seconds", raw["retry_seconds"], 30.0, float, 0.01, 86400),
        give_up_seconds=_number("give_up_seconds", raw["give_up_seconds"], 86400.0, float, 1, 90 * 86400),
        max_per_pass=_number("max_per_pass", raw["max_per_pass"], 20, int, 1, 10_000),
    )
    if t.smtp_host and not t.email_to:
        raise ConfigError(f"{_P}SMTP_HOST is set but {_P}EMAIL_TO is not: whom should e-mail go to?")
    if t.email_to and not t.smtp_host:
        raise ConfigError(f"{_P}EMAIL_TO is set but {_P}SMTP_HOST is not: which relay sends it?")
    if bool(t.smtp_user) != bool(t.smtp_password):
        raise ConfigError(f"{_P}SMTP_USER and {_P}SMTP_PASSWORD(_FILE) go together: set both or neither")
    return t


def _list(text: str) -> tuple[str, ...]:
    return tuple(x for x in (p.strip() for p in text.replace("\n", ",").split(",")) if x)


def _urls(text: str, setting: str) -> tuple[str, ...]:
    """Webhook URLs: each an http(s) URL with a host, a port that is a port and a user:password
    (sent as HTTP Basic auth) that every parser reads alike; else ConfigError naming `setting` and
    the URL masked (scheme and host at most: the rest may carry a token)."""
    urls = _list(text)
    for i, u in enumerate(urls, 1):
        problem = _url_problem(u)
        if problem:
            raise ConfigError(f"{setting}: webhook {i} ({_masked(u)}) {problem}")
    return urls


def _url_problem(url: str) -> str | None:
    from ..common.limits import url_problem

    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises for a port that is not one
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not url.lower().startswith(f"{parts.scheme}://"):
        return "must be an http:// or https:// URL"
    if not host:
        return "has no host"
    return url_problem(url)


def _masked(url: str) -> str:
    """A URL as an error may show it: its scheme and host, the rest ***."""
    scheme, sep, rest = url.partition(":")
    if not sep or not scheme.isascii() or not scheme.replace("+", "").replace("-", "").replace(".", "").isalnum():
        return "***"
    if not rest.startswith("//"):
        return f"{scheme}:***"
    host = rest[2:].split("/", 1)[0].rpartition("@")[2]
    safe = host if host and all(c.isalnum() or c in ".-:[]" for c in host) else "***"
    return f"{scheme}://{safe}/***"


def _events(name: str, text: str) -> tuple[str, ...]:
    chosen = _list(text)
    if not chosen:
        return KINDS
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise ConfigError(f"{_P}{name.upper()}={text!r}: unknown event(s) {', '.join(unknown)} "
                          f"(events: {', '.join(KINDS)})")
    return chosen


def _flag(name: str, text: str) -> bool:
    low = text.lower()
    if low not in _TRUE + _FALSE:
        raise ConfigError(f"{_P}{name.upper()}={text!r}: must be true or false")
    return low in _TRUE


def _number(name: str, text: str, default: float, kind: type, lo: float, hi: float):  # type: ignore[no-untyped-def]
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"{_P}{name.upper()}={text!r}: must be {'an integer' if kind is int else 'a number'}") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{_P}{name.upper()}={text!r}: must be between {lo:g} and {hi:g}")
    return value
