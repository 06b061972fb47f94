"""Limits on every input, checked once at the edge, before anything reaches the ledger or the queue.

A spec, a results file, a command argument and an environment variable all pass the same checks
here, so a value is refused with one line and exit 2 the same way on SQLite and on PostgreSQL
(which would otherwise disagree: PostgreSQL refuses a name longer than its column, NaN in JSON, a
NUL character, an integer beyond 64 bits; SQLite stores them). The lengths of the ledger's columns
that hold these values are stated here and `ledger/schema.py` declares its columns with them, so
this module does not import the ledger (every command reads its settings through it).

Each `*_problem` function returns None for a good value, else a phrase saying what is wrong
("is 200 characters; at most 128"); callers put it in their own error (SpecError, RecordError,
ConfigError, click.BadParameter), which names the file, field or option. `read_input_file` and
`load_json` raise `InputRefused` with such a phrase.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# -- names ---------------------------------------------------------------------------------------
# Experiment, queue and profile names: letters, digits, '_' and '-'. The limit is this project's
# choice (a run key must hold the longest name, version, seed and arm; asserted below).
NAME_MAX = 64
NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_-]{{0,{NAME_MAX - 1}}}$")
NAME_RULE = f"letters, digits, '_' or '-', at most {NAME_MAX}"
# The columns that hold names (experiments.name, decisions.experiment_name) are longer than NAME_MAX;
# experiments.queue is NAME_MAX long (ledger/schema.py; tests/test_migrations.py checks both).
NAME_COLUMN_LENGTH = 128
# Arm names: no '-' (run keys are split on it); the length of the runs.arm column.
ARM_NAME_MAX = 64
ARM_NAME = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_]{{0,{ARM_NAME_MAX - 1}}}$")
ARM_NAME_RULE = f"letters, digits and '_', at most {ARM_NAME_MAX}"
# Run keys are RQ job ids: RQ accepts only [A-Za-z0-9_-]. The length of the runs.run_key column.
RUN_KEY_MAX = 200
RUN_KEY = re.compile(rf"^[A-Za-z0-9_-]{{1,{RUN_KEY_MAX}}}$")
# An outcome set's name (`evaluate --name`, a spec's [[evaluations]] name): an arm name's rule, no
# '-', so an evaluation's key `<run key>-eval_<name>` (an RQ job id) names one pair only. The
# length of the evaluations.key column.
EVALUATION_KEY_INFIX = "-eval_"
EVALUATION_KEY_MAX = RUN_KEY_MAX + len(EVALUATION_KEY_INFIX) + ARM_NAME_MAX
# Who did something (GGPO_USER, or the login name): the length of every actor column.
USER_MAX = 128
# An RQ worker's name: the length of runs.worker and attempts.worker.
WORKER_NAME_MAX = 200

# -- numbers -------------------------------------------------------------------------------------
SEED_MIN, SEED_MAX = 0, 2**63 - 1  # runs.seed is a BIGINT
INT32_MAX = 2**31 - 1  # an INTEGER column: experiment versions, GPUs of an attempt
VERSION_MAX = INT32_MAX
DURATION_MAX_SECONDS = 100 * 365 * 86400  # an elapsed time the ledger turns into start and end times
INT_MAX = 2**63 - 1  # any integer in a JSON field: |n| <= INT_MAX (at most 19 digits)
# An integer in a file another tool writes (a checkpoint's JSON, read with `load_json(ledger=False)`):
# transformers' save_pretrained writes int(1e30), its "unset" model_max_length, as the 31 digits
# 1000000000000000019884624838656; 40 digits holds it with room and stays far below CPython's
# 4,300-digit parse limit. Such a value never reaches the ledger (preflight facts keep INT_MAX).
FILE_INT_DIGITS = 40
GPU_HOURS_MAX = 1e7  # a cap or an estimate of GPU-hours (a spec's max_gpu_hours, GGPO_*_GPU_HOURS_CAP)

# -- text, JSON, files ---------------------------------------------------------------------------
TEXT_MAX = 10_000  # a reason, a cost basis, a description: characters
JSON_MAX_DEPTH = 32  # nesting of arrays and objects in a results file or a spec's [train] table
SPEC_MAX_BYTES = 1 << 20
RESULTS_MAX_BYTES = 64 << 20
SECRET_FILE_MAX_BYTES = 64 << 10

_run_key_room = len(f"-v{VERSION_MAX}-{SEED_MAX}-")
assert NAME_MAX + _run_key_room + ARM_NAME_MAX <= RUN_KEY_MAX, "the longest run key must fit runs.run_key"
assert NAME_MAX <= NAME_COLUMN_LENGTH, "an experiment name must fit its columns"


class InputRefused(Exception):
    """A file or value refused by a limit; `problem` is the phrase for the caller's error."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _show(value: str, limit: int = 40) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "...")


def text_problem(value: Any, *, max_chars: int = TEXT_MAX, single_line: bool = False) -> str | None:
    """Text the ledger can store the same way on both backends: UTF-8 (no lone surrogates, which an
    undecodable byte in a command argument becomes), no NUL character, at most `max_chars`."""
    if not isinstance(value, str):
        return f"must be text, got {type(value).__name__}"
    if len(value) > max_chars:
        return f"is {len(value)} characters; at most {max_chars}"
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text"
    if single_line and any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "contains a control character (newline, tab, ...)"
    return None


def _pattern_problem(value: Any, pattern: re.Pattern[str], rule: str) -> str | None:
    if not isinstance(value, str):
        return f"must be text, got {type(value).__name__}"
    if not value:
        return f"is empty ({rule})"
    if not pattern.match(value):
        shown = _show(value.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))
        return f"{shown} is not a valid name ({rule})"
    return None


def name_problem(value: Any) -> str | None:
    """An experiment, queue or profile name."""
    return _pattern_problem(value, NAME, NAME_RULE)


def arm_name_problem(value: Any) -> str | None:
    return _pattern_problem(value, ARM_NAME, ARM_NAME_RULE)


def outcome_set_problem(value: Any) -> str | None:
    """The name of an outcome set (an evaluation after training)."""
    return _pattern_problem(value, ARM_NAME, ARM_NAME_RULE)


def run_key_problem(value: Any) -> str | None:
    return _pattern_problem(value, RUN_KEY, f"letters, digits, '_' or '-', at most {RUN_KEY_MAX}")


def worker_name_problem(value: Any) -> str | None:
    """An RQ worker name, recorded on runs and attempts."""
    return text_problem(value, max_chars=WORKER_NAME_MAX, single_line=True)


def user_problem(value: Any) -> str | None:
    """A user name recorded as an actor: one line of text, at most USER_MAX characters."""
    if isinstance(value, str) and not value.strip():
        return "is empty"
    return text_problem(value, max_chars=USER_MAX, single_line=True)


def int_problem(value: Any, lo: int, hi: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {type(value).__name__}"
    if not lo <= value <= hi:
        shown = str(value) if abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
        return f"must be between {lo} and {hi}, got {shown}"
    return None


def seed_problem(value: Any) -> str | None:
    return int_problem(value, SEED_MIN, SEED_MAX)


def count_problem(value: Any) -> str | None:
    """A count or page size that goes into SQL (LIMIT): a 64-bit integer on both backends."""
    return int_problem(value, 0, INT_MAX)


def version_problem(value: Any) -> str | None:
    return int_problem(value, 1, VERSION_MAX)


def number_problem(value: Any, *, lo: float | None = None) -> str | None:
    """A finite number (NaN and infinities are stored as NULL by SQLite, as themselves by PostgreSQL)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {type(value).__name__}"
    if isinstance(value, int) and abs(value) > INT_MAX:
        return f"is beyond {INT_MAX} in size"
    if not math.isfinite(value):
        return f"must be finite, got {value}"
    if lo is not None and value < lo:
        return f"must be >= {lo:g}, got {value}"
    return None


def json_problem(value: Any, *, max_depth: int = JSON_MAX_DEPTH, ledger: bool = True) -> str | None:
    """Plain JSON both backends store alike: objects with text keys, arrays, text, booleans, null,
    finite numbers, integers of at most 64 bits, nested at most `max_depth` deep. The phrase names
    the first bad place ("at a.b[3]: ..."). `ledger=False`: JSON that never reaches the ledger (a
    checkpoint's files): only the depth and the values the parser refused."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        v, where, depth = stack.pop()
        at = f"at {where}: " if where else ""
        if isinstance(v, (Mapping, list, tuple)):
            if depth >= max_depth:
                return f"{at}nested deeper than {max_depth}"
            if isinstance(v, Mapping):
                for k, item in v.items():
                    if not isinstance(k, str):
                        return f"{at}key {k!r} is not text"
                    problem = text_problem(k) if ledger else None
                    if problem:
                        return f"{at}key {problem}"
                    stack.append((item, f"{where}.{k}" if where else k, depth + 1))
            else:
                stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(v))
        elif v is None or isinstance(v, bool):
            continue
        elif isinstance(v, str):
            problem = text_problem(v, max_chars=RESULTS_MAX_BYTES) if ledger else None
            if problem:
                return f"{at}{problem}"
        elif isinstance(v, _Refused):
            return f"{at}{v.problem}"
        elif isinstance(v, (int, float)):
            problem = number_problem(v) if ledger else None
            if problem:
                return f"{at}{problem}"
        else:
            return f"{at}{type(v).__name__} is not a JSON value"
    return None


class _Refused:
    """A value the JSON parser met that JSON or the ledger cannot hold (NaN, an infinity, a 5,000-digit
    integer), kept in its place so that `json_problem` names where it is ("at 0/clean.timing.x")."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _refuse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a finite number (JSON has no NaN or Infinity)")


def _bounded_int(text: str) -> int | _Refused:
    digits = len(text.lstrip("-"))
    if digits > len(str(INT_MAX)):  # (int() of over 4,300 digits would raise; 19 digits: number_problem)
        return _Refused(f"an integer of {digits} digits; at most {INT_MAX} in size")
    return int(text)


def _file_int(text: str) -> int | _Refused:
    digits = len(text.lstrip("-"))
    if digits > FILE_INT_DIGITS:
        return _Refused(f"an integer of {digits} digits; at most {FILE_INT_DIGITS}")
    return int(text)


def _finite_float(text: str) -> float | _Refused:
    value = float(text)
    if not math.isfinite(value):
        return _Refused(f"the number {text[:30]} is not finite as a 64-bit float")
    return value


def load_json(raw: bytes | str, *, max_depth: int = JSON_MAX_DEPTH, ledger: bool = True) -> Any:
    """Parse JSON with the limits above (no NaN/Infinity, bounded integers and depth); a refusal
    names the place of the bad value ("at a.b[3]: NaN is not a finite number ..."). `ledger=False`
    for a file another tool wrote that never reaches the ledger (a checkpoint's JSON): integers of up
    to FILE_INT_DIGITS digits, and none of the ledger's text rules."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputRefused(f"is not UTF-8 text (byte {exc.start})") from None
    else:
        text = raw
    try:
        data = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int if ledger else _file_int,
                          parse_float=_finite_float)
    except RecursionError:
        place = deep_place(text, max_depth)
        raise InputRefused(f"at {place}: nested deeper than {max_depth}" if place else
                           f"is nested too deep (at most {max_depth})") from None
    except json.JSONDecodeError as exc:
        raise InputRefused(f"is not valid JSON (truncated or corrupt?): {exc}") from None
    problem = json_problem(data, max_depth=max_depth, ledger=ledger)
    if problem:
        raise InputRefused(problem)
    return data


def deep_place(text: str, max_depth: int) -> str | None:
    """Where JSON `text` first nests deeper than `max_depth` ("question[0][0]...", as `json_problem`
    names places), found by one scan that keeps only the open containers (so it works where the
    parser ran out of recursion); None if it does not."""
    stack: list[list[Any]] = []  # [key or None] of an open object, [index] of an open array
    in_string = escaped = False
    chars: list[str] = []
    last = ""
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string, last = False, "".join(chars)
            elif len(chars) < 64:
                chars.append(ch)
        elif ch == '"':
            in_string, chars = True, []
        elif ch == ":" and stack and not isinstance(stack[-1][0], int):
            stack[-1][0] = last
        elif ch == "," and stack and isinstance(stack[-1][0], int):
            stack[-1][0] += 1
        elif ch in "[{":
            if len(stack) >= max_depth:
                return "".join(f"[{k}]" if isinstance(k, int) else f".{k or '?'}" for (k,) in stack).lstrip(".")
            stack.append([0] if ch == "[" else [None])
        elif ch in "]}" and stack:
            stack.pop()
    return None


def read_input_file(path: str | Path, *, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most `max_bytes`, checked before reading: a FIFO, a device
    (/dev/zero) or a directory is refused without blocking on it or reading it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputRefused("no such file") from None
    except IsADirectoryError:
        raise InputRefused(f"is a directory, not a {what}") from None
    except OSError as exc:
        raise InputRefused(f"cannot be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputRefused(f"is a directory, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise InputRefused(f"is not a regular file (a FIFO, socket or device); a {what} must be one")
        if st.st_size > max_bytes:
            raise InputRefused(f"is {st.st_size} bytes; a {what} is at most {max_bytes}")
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise InputRefused(f"cannot be read ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # grew while being read
        raise InputRefused(f"is over {max_bytes} bytes; a {what} is at most {max_bytes}")
    return data


def url_userinfo(url: str) -> str | None:
    """The `user:password` part of a URL with a network location (None if it has none): what
    precedes the last '@' of the part after `scheme://` (RFC 3986: userinfo ends at the last '@')."""
    _scheme, sep, rest = url.partition("://")
    if not sep or rest.startswith("/"):  # sqlite:///path, unix:///path: no network location
        return None
    at = rest.rfind("@")
    return rest[:at] if at >= 0 else None


def url_problem(url: str) -> str | None:
    """A service URL whose user and password every parser reads the same way: in `user:password`,
    characters that end it or start the path ('@', '/', '?', '#', '[', ']') and whitespace must be
    percent-encoded (SQLAlchemy and redis-py split a raw '@' differently and would send a piece of
    the password on as the host name). The phrase never contains the URL."""
    if any(c.isspace() for c in url.strip()):
        return "contains whitespace; percent-encode it (a space as %20)"
    userinfo = url_userinfo(url)
    if userinfo is None:
        return None
    raw = sorted({c for c in userinfo if c in "@/?#[]"})
    if raw:
        shown = ", ".join(f"{c!r} as %{ord(c):02X}" for c in raw)
        return f"its user:password part has reserved characters written raw; percent-encode them ({shown})"
    return None


def path_text(path: str | Path) -> str:
    """A file name as text the ledger can store: bytes that are not UTF-8 become U+FFFD."""
    return os.fsencode(path).decode("utf-8", "replace")
