"""Rows of a `[train.data]` file, JSONL or Parquet by its suffix, read as untrusted input.

Every rule holds for both formats: a row (a JSONL line; a Parquet row as JSON) of at most
DATA_LINE_MAX_BYTES, values within the limits of every input (limits.json_problem: finite numbers,
integers of 64 bits, nesting of 32), each row an object; a refusal names the file, the row (a
JSONL line's number, a Parquet row's index from 0) and the field. A Parquet file is checked from its
footer before any data is read (a footer of at most PARQUET_FOOTER_MAX_BYTES, row groups of at most
PARQUET_ROW_GROUP_MAX_BYTES uncompressed, a
schema nested at most 32 deep, no column of a type JSON cannot hold) and then read one row group at
a time, so a hostile file cannot make the reader hold more than one bounded row group.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import SpecError

# One line of a JSONL file (an item or a passage), or one Parquet row as JSON: longer is refused.
DATA_LINE_MAX_BYTES = 1 << 20
# One Parquet row group, uncompressed, as the footer states it: larger is refused before it is read.
PARQUET_ROW_GROUP_MAX_BYTES = 256 << 20
# A Parquet footer (the schema and every row group's metadata), read whole by pyarrow: larger is refused.
PARQUET_FOOTER_MAX_BYTES = 16 << 20
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
PARQUET_SUFFIXES = (".parquet", ".pq")


class DataFileError(SpecError):
    """A `[train.data]` file that is absent or does not hold the documented format."""

    def __init__(self, path: object, field: str, problem: str, *, absent: bool = False) -> None:
        super().__init__(path, field, problem)
        self.absent = absent


def rows(path: str, field: str, spec_path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, place, object) of each row of a data file: `where` names the file and the row in a message
    (`path:3`, `path: row 2`), `place` the row alone (`line 3`, `row 2`)."""
    p = Path(path)
    if not p.exists():
        raise DataFileError(spec_path, field, f"{path} is absent from this machine", absent=True)
    if not p.is_file():
        raise DataFileError(spec_path, field, f"{path} is not a regular file")
    suffix = p.suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        yield from _parquet_rows(p, field, spec_path)
    elif suffix in JSONL_SUFFIXES:
        yield from _jsonl_rows(p, field, spec_path)
    else:
        raise DataFileError(spec_path, field, f"{path}: a data file is JSONL ({', '.join(JSONL_SUFFIXES)}) or "
                            f"Parquet ({', '.join(PARQUET_SUFFIXES)}), by its suffix; got {suffix or 'none'!r}")


def _jsonl_rows(p: Path, field: str, spec_path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    from ...common import limits

    try:
        fh = p.open("rb")
    except OSError as exc:
        raise DataFileError(spec_path, field, f"{p}: cannot be read ({exc.strerror})") from None
    with fh:
        for n, line in enumerate(iter(lambda: fh.readline(DATA_LINE_MAX_BYTES + 1), b""), 1):
            if len(line) > DATA_LINE_MAX_BYTES:
                raise DataFileError(spec_path, field, f"{p}:{n}: the line is over {DATA_LINE_MAX_BYTES} bytes")
            if not line.strip():
                continue
            try:
                row = limits.load_json(line)
            except limits.InputRefused as exc:
                raise DataFileError(spec_path, field, f"{p}:{n}: {exc.problem}") from None
            if not isinstance(row, dict):
                raise DataFileError(spec_path, field, f"{p}:{n}: a line must be a JSON object")
            yield f"{p}:{n}", f"line {n}", row


def _parquet_rows(p: Path, field: str, spec_path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    from ...common import limits

    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataFileError(spec_path, field, f"{p}: reading Parquet needs pyarrow (pip install "
                            f"'ggpo-batch[train]')") from None

    def bad(problem: str) -> DataFileError:
        return DataFileError(spec_path, field, f"{p}: {problem}")

    footer = _footer_length(p)
    if isinstance(footer, str):
        raise bad(footer)
    if footer > PARQUET_FOOTER_MAX_BYTES:
        raise bad(f"its footer (the schema and row-group metadata) is {footer:,} bytes, over {PARQUET_FOOTER_MAX_BYTES:,}")
    try:
        pf = pq.ParquetFile(p)
        meta = pf.metadata
        schema = pf.schema_arrow
    except Exception as exc:  # noqa: BLE001  (pyarrow raises ArrowInvalid, OSError... for a damaged footer)
        raise bad(f"is not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})") from None
    for f in schema:
        problem = _type_problem(f.type, 1)
        if problem:
            raise bad(f"column {f.name!r} has type {f.type}: {problem}")
    for g in range(meta.num_row_groups):
        size = meta.row_group(g).total_byte_size
        if size > PARQUET_ROW_GROUP_MAX_BYTES:
            raise bad(f"row group {g} holds {size:,} bytes uncompressed, over {PARQUET_ROW_GROUP_MAX_BYTES:,}: "
                      f"write it with smaller row groups (pyarrow.parquet.write_table(..., row_group_size=N))")
    index = 0
    for g in range(meta.num_row_groups):
        try:
            table = pf.read_row_group(g)
        except Exception as exc:  # noqa: BLE001  (a damaged page, a size the footer misstated)
            raise bad(f"row group {g} cannot be read ({type(exc).__name__}: {_first_line(exc)})") from None
        for row in table.to_pylist():
            where = f"{p}: row {index}"
            problem = limits.json_problem(row)
            if problem:
                raise DataFileError(spec_path, field, f"{where}: {problem}")
            if len(json.dumps(row)) > DATA_LINE_MAX_BYTES:
                raise DataFileError(spec_path, field, f"{where}: the row is over {DATA_LINE_MAX_BYTES} bytes as JSON")
            yield where, f"row {index}", row
            index += 1


def _footer_length(p: Path) -> int | str:
    """The footer's length from a Parquet file's last 8 bytes (4 of length, then b"PAR1"), or what is wrong."""
    try:
        with p.open("rb") as fh:
            size = fh.seek(0, 2)
            if size < 12:
                return "is not a Parquet file (too short)"
            fh.seek(size - 8)
            tail = fh.read(8)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if tail[4:] != b"PAR1":
        return "is not a Parquet file (no PAR1 at its end)"
    return int.from_bytes(tail[:4], "little")


def _type_problem(t: Any, depth: int) -> str | None:
    """What keeps an Arrow type from being read as JSON values (None: nothing)."""
    import pyarrow.types as pt

    from ...common import limits

    if depth > limits.JSON_MAX_DEPTH:
        return f"nested over {limits.JSON_MAX_DEPTH} deep"
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return _type_problem(t.value_type, depth + 1)
    if pt.is_struct(t):
        for i in range(t.num_fields):
            problem = _type_problem(t.field(i).type, depth + 1)
            if problem:
                return problem
        return None
    if pt.is_string(t) or pt.is_large_string(t) or pt.is_integer(t) or pt.is_floating(t) or pt.is_boolean(t) \
            or pt.is_null(t):
        return None
    return "a data file's columns hold strings, numbers, booleans, lists and structs of them"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def column(row: dict[str, Any], name: str) -> tuple[bool, Any]:
    """(found, value) of column `name` in `row`; a dotted name reads a nested object
    (`reward_model.ground_truth`) where the row has no column of that very name."""
    if name in row:
        return True, row[name]
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value
