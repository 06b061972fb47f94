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
- `config/logs.py`'s `configure_logging`: every log record, text or JSON, of every process (a
  training job's has no command around it).
- `scrub(data)`: structured data masked before it is laid out, where the layout could cut or
  escape a secret first (a table cell cut at 60 characters, Markdown or HTML escaping): the CLI's
  tables, reports and JSON documents, and every page and API body of the dashboard.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from ..common.printable import map_strings, terminal_text
from .secrets import redact
from .settings import remember_secrets


def scrub(value: Any) -> Any:
    """`value` (str, or dicts/lists/tuples of them) with every secret replaced by *** (keys too)."""
    return map_strings(value, redact)


class MaskedText(io.TextIOBase):
    """A text stream that masks every write (`config.redact`) before passing it to `raw`, and escapes
    the terminal control characters in it (`common.printable.terminal_text`: a reason or an error
    read from a ledger from elsewhere may hold escape codes). It has no binary `buffer`, so nothing
    (click's echo of bytes) writes around it. `layout_stream` gives rich its own, which keeps rich's
    styles: what rich lays out is escaped field by field first (`printable_data`)."""

    def __init__(self, raw: TextIO, *, controls_escaped: bool = True) -> None:
        super().__init__()
        self.raw = raw
        self.controls_escaped = controls_escaped

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        masked = redact(text)
        self.raw.write(terminal_text(masked) if self.controls_escaped else masked)
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


def layout_stream(stream: TextIO) -> TextIO:
    """The stream a rich console writes to: `stream`, masked, with rich's own escape codes (colours,
    a live progress display) kept. The fields it lays out must be `printable_data` already."""
    return MaskedText(stream.raw, controls_escaped=False) if isinstance(stream, MaskedText) else stream


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
