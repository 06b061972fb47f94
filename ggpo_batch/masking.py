"""Known secrets kept out of everything the system shows: the one home of how output is masked.

The secrets are those `config` remembers (the passwords of the configured ledger, Redis and MLflow
URLs, and the dashboard's token, with `remember_secrets` reading them before anything is printed);
`config.redact` masks them, and the password of any URL, in a text. Text a user typed (a decision's
reason, a cost basis) or a job printed (its log, a failure's cause) may quote them, so every output
passes through here the same way:

- `masked_output()`: every command's stdout and stderr (click's echo, rich's tables, logging,
  progress) become `MaskedText` streams, which mask each write; `masked_file` does the same for the
  files a command writes (`report -o`, `ledger export -o`). A write is masked whole, so callers
  write whole lines (`joblogs.LineCuts` cuts a log at its line ends).
- `mask_logging()`: the records a training job logs (it has no command around it).
- `scrub(data)`: structured data masked before it is laid out, where the layout could cut or
  escape a secret first (a table cell cut at 60 characters, Markdown or HTML escaping): the CLI's
  tables, reports and JSON documents, and every page and API body of the dashboard.
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TextIO

from .config import redact, remember_secrets


def scrub(value: Any) -> Any:
    """`value` (str, or dicts/lists/tuples of them) with every secret replaced by *** (keys too)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


class MaskedText(io.TextIOBase):
    """A text stream that masks every write (`config.redact`) before passing it to `raw`. It has
    no binary `buffer`, so nothing (click's echo of bytes) writes around it."""

    def __init__(self, raw: TextIO) -> None:
        super().__init__()
        self.raw = raw

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.raw.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self.raw, "errors", None)

    def close(self) -> None:  # the underlying stream belongs to whoever opened it
        try:
            self.flush()
        except (OSError, ValueError):  # already closed by its owner
            pass


class _MaskedRecords(logging.Filter):
    """A log record's message, masked (its arguments merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def mask_logging() -> None:
    """Mask every record the root logger's handlers write (a training job's log: its own warnings
    and those of the libraries it calls, which may quote a URI)."""
    remember_secrets()
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _MaskedRecords) for f in handler.filters):
            handler.addFilter(_MaskedRecords())


def masked_file(fh: TextIO) -> MaskedText:
    """`fh` (a file a command writes its output into), masked like stdout."""
    return MaskedText(fh)


@contextmanager
def masked_output() -> Iterator[None]:
    """Mask stdout and stderr while the block runs (a command), its secrets remembered first."""
    remember_secrets()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = MaskedText(saved[0]), MaskedText(saved[1])
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        sys.stdout, sys.stderr = saved
