"""Text from elsewhere as it may be shown on a terminal: the one home of how the project escapes it.

A ledger may come from another team or another machine, a job's reason quotes what a library
printed, a notification's error quotes what a server answered: any of them may hold terminal
escape codes (clear the screen, move the cursor, set the window title, write the clipboard through
OSC 52) or line breaks that forge a line of output. Two levels:

- `printable(value)`: one field, on one line: every unprintable character (line breaks included)
  backslash-escaped (`\\x1b`, `\\n`), as Python writes it in a string literal; for table cells, a
  revision string, a Markdown code span.
- `LineEnds`: a job's log as lines: a bare carriage return (a progress bar redrawing its line) ends
  a line, so no redraw can hide what was printed before it on the same line.
- `terminal_text(text)`: a whole write to the terminal (`config.masking.MaskedText`): the C0 and C1
  control characters and DEL escaped, line breaks and tabs kept, so lines the command itself
  writes stay lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# C0 controls but tab and line feed, DEL, and the C1 controls (0x80-0x9f: CSI 0x9b is an escape
# sequence on its own on some terminals)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escaped(c: str) -> str:
    return c.encode("unicode_escape").decode("ascii")


def printable(value: object, limit: int | None = None) -> str:
    """`value` as text on one line: unprintable characters (controls, line breaks, separators)
    backslash-escaped; cut at `limit` characters with "..." when given. A space stays a space."""
    text = "".join(c if c.isprintable() or c == " " else _escaped(c) for c in str(value))
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """`fn` applied to every string in dicts, lists and tuples (keys too; tuples come back as lists);
    other values as they are. What `printable_data` and `config.masking.scrub` walk with."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {map_strings(k, fn): map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(v, fn) for v in value]
    return value


def printable_data(value: Any) -> Any:
    """`printable` applied to every string in `value` (`map_strings`)."""
    return map_strings(value, printable)


def terminal_text(text: str) -> str:
    """`text` with its control characters escaped, line breaks and tabs kept."""
    return _CONTROLS.sub(lambda m: _escaped(m.group()), text) if _CONTROLS.search(text) else text


class LineEnds:
    """A stream's text with every carriage return made a line end ("\\r\\n" and a bare "\\r" both
    become "\\n"), across the chunks it is read in: a "\\r" passed to the terminal would draw the next
    text over the line (`terminal_text` would escape it, which is unreadable for a progress bar)."""

    def __init__(self) -> None:
        self._after_cr = False

    def __call__(self, text: str) -> str:
        if self._after_cr and text.startswith("\n"):  # "\r" | "\n" split between two chunks
            text = text[1:]
        if text:
            self._after_cr = text.endswith("\r")
        return text.replace("\r\n", "\n").replace("\r", "\n")
