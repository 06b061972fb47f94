"""How every ggpo-batch process logs: `configure_logging`, the one function the CLI (and so the
worker and the nightly schedule it runs), the training and evaluation jobs and the nightly tier's
own entry point call.

GGPO_LOG_FORMAT (settings-file key `log_format`, config/settings.py): `text` (the default: each
caller's layout), or `json`: one JSON object a line with `time` (UTC, ISO 8601), `level`, `logger`,
`message`, and `run_key`, `attempt` and `job_id` where known (a job's fixed context, or
`log_context` around a worker's submission), `rank` in a job, `exception` with its traceback.
Secrets are masked as in every other output (config/masking.py's `redact`), field by field before
the line is encoded, so JSON's escaping never splits one.

JSON, once chosen, is put into this process's environment, so the processes it starts log the same
way: an allocation's job inherits the submitting worker's environment (sbatch passes it by default;
the local executor's processes inherit it), even when the worker read `log_format` from a file.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, TextIO

from ..errors import ConfigError
from .secrets import redact
from .settings import LOG_FORMAT_ENV, log_format, remember_secrets

# The fields a record may carry about the run it concerns, in the order a JSON line shows them.
CONTEXT_FIELDS = ("run_key", "attempt", "job_id", "rank")
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "ggpo_log_context", default=MappingProxyType({}))


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Records logged inside the block carry `fields` (run_key, attempt, job_id; None: unknown)."""
    token = _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Add `fields` to the current context (a job id learnt inside a `log_context` block)."""
    _context.set({**_context.get(), **{k: v for k, v in fields.items() if v is not None}})


class JsonLines(logging.Formatter):
    """One JSON object a line; `fixed`: fields every record of this process carries (a job's run)."""

    def __init__(self, fixed: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.fixed = {k: v for k, v in (fixed or {}).items() if v is not None}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        known = {**self.fixed, **_context.get()}
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            value = known.get(name) if value is None else value
            if value is not None:
                doc[name] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exception"] = redact(self.formatException(record.exc_info))
        elif record.stack_info:
            doc["exception"] = redact(self.formatStack(record.stack_info))
        return json.dumps(doc, ensure_ascii=False, default=str)


class _Masked(logging.Filter):
    """A text record's message, masked (its arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


class _OurHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler `configure_logging` installs (and replaces when called again)."""


def configure_logging(*, level: int = logging.INFO, text_format: str = "%(asctime)s %(levelname)s %(name)s: %(message)s",
                      fmt: str | None = None, context: Mapping[str, Any] | None = None,
                      stream: TextIO | None = None, env: Mapping[str, str] | None = None, carry: bool = True) -> str:
    """Configure the root logger of this process; returns the format used ("text" or "json").

    `fmt`: "text" or "json" (default: GGPO_LOG_FORMAT from `env`, else the environment over the
    settings files; an unreadable setting falls back to text, and the command that reads the
    settings reports it). `text_format`: the caller's layout in text. `context`: fields every record
    carries (a job's run key, attempt, job id, rank). As `logging.basicConfig` did before, text leaves
    a logger configured already as it is; json replaces the handler it installed before. With
    `carry`, json is exported to the processes started from here (not by `config`, which shows
    where each setting came from)."""
    if fmt is None:
        try:
            fmt = log_format(env)
        except ConfigError:
            fmt = "text"
    remember_secrets()
    if fmt == "json" and carry:  # what the processes started from here (an allocation's job) inherit
        os.environ[LOG_FORMAT_ENV] = fmt
    root = logging.getLogger()
    if fmt == "text" and root.handlers:
        # Configured already (the CLI around a debug job, a test's capture): left as it is, as
        # basicConfig did, but masked.
        for h in root.handlers:
            if not any(isinstance(f, _Masked) for f in h.filters):
                h.addFilter(_Masked())
        return fmt
    ours = [h for h in root.handlers if isinstance(h, _OurHandler)]
    for h in ours:  # json again (a job forked from a JSON worker): its own context, the level kept
        root.removeHandler(h)
    handler = _OurHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonLines(context) if fmt == "json" else logging.Formatter(text_format))
    handler.addFilter(_Masked())
    root.addHandler(handler)
    if not ours:
        root.setLevel(level)
    if fmt == "json":  # a library's warnings.warn() too (else a bare text line among the JSON ones)
        logging.captureWarnings(True)
    return fmt
