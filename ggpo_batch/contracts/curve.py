"""A run's learning curve: one point per training step, its figures taken from the step's history
entry, and the file in which the job keeps them while it trains.

Rank 0 of the training job rewrites `<attempt folder>/curve.jsonl` with the run's history so far
when it starts (a resumed run brings its earlier steps) and appends each step's point as the step
ends (train/live_progress.py; one short line a step): the dashboard reads the file of a running
attempt; at the end settlement books the details' history into the ledger (`curve_points`), where
`report` and the dashboard read every finished run's curve without opening its details file.

History entries are read generically: a field the entry lacks (older runs, or figures a trainer
does not record yet) is None; a figure that is not a finite number is None. The file is the job's:
it is read as an untrusted file (a regular file, not a link; at most CURVE_MAX_BYTES from its end;
a line that is not a point is skipped).
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

CURVE_NAME = "curve.jsonl"
# The figures of a point, each a column of the ledger's curve_points: (name, where in a history
# entry). `step` and `loop_seconds` place the point; the others are what the run measured then.
CURVE_FIELDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loop_seconds", ("loop_seconds",)),
    ("mean_reward", ("mean_reward",)),
    ("kl", ("kl",)),
    ("loss", ("loss",)),
    ("clip_fraction", ("clip_fraction",)),
    ("tokens_per_second", ("tokens_per_second",)),
    ("gradient_norm", ("gradient_norm",)),
    ("mean_length", ("mean_length",)),
    ("logprob_gap_mean", ("logprob_gap_mean",)),
    ("logprob_gap_p99", ("logprob_gap_p99",)),
    ("is_weight_mean", ("is_weight_mean",)),
    ("weight_sync_seconds", ("weight_sync_seconds",)),
    ("probe_gap", ("weight_sync_probe", "gap")),
)
FIGURES = tuple(name for name, _ in CURVE_FIELDS)
CURVE_MAX_BYTES = 8 << 20  # a point is about 400 bytes: ~20,000 steps
MAX_STEP = 2**31 - 1


def point_of(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The curve point of one history entry ({"step", *FIGURES}); None without a step."""
    step = entry.get("step") if isinstance(entry, Mapping) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return None
    out: dict[str, Any] = {"step": step}
    for name, path in CURVE_FIELDS:
        value: Any = entry
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        out[name] = _number(value)
    return out


def points_of(history: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The curve of a history: one point per step (the last entry of a step wins), in step order."""
    by_step: dict[int, dict[str, Any]] = {}
    for entry in history:
        p = point_of(entry)
        if p is not None:
            by_step[p["step"]] = p
    return [by_step[s] for s in sorted(by_step)]


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def curve_path(folder: Path) -> Path:
    return Path(folder) / CURVE_NAME


def start_curve(folder: Path, history: Sequence[Mapping[str, Any]]) -> None:
    """Rewrite the attempt's curve file with the points of `history` (empty for a new run)."""
    path = curve_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text("".join(_line(p) for p in points_of(history)))
    os.replace(tmp, path)


def append_points(folder: Path, points: Sequence[Mapping[str, Any]]) -> None:
    """Append `points` to the attempt's curve file (one write: a reader sees whole lines, or a last
    partial line it skips)."""
    if points:
        with open(curve_path(folder), "a", encoding="utf-8") as fh:
            fh.write("".join(_line(p) for p in points))


def _line(p: Mapping[str, Any]) -> str:
    return json.dumps(p, allow_nan=False, separators=(",", ":")) + "\n"


def read_curve(folder: Path, max_bytes: int = CURVE_MAX_BYTES) -> list[dict[str, Any]]:
    """The points of the attempt's curve file, in step order; [] when there is none or it is not a
    regular file (never raises). A file longer than `max_bytes` is read from its last whole line
    within that many bytes of its end."""
    path = curve_path(folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return []
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return []
        start = max(0, st.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        raw = b""
        while len(raw) < st.st_size - start:
            chunk = os.read(fd, min(1 << 20, st.st_size - start - len(raw)))
            if not chunk:
                break
            raw += chunk
    except OSError:
        return []
    finally:
        os.close(fd)
    lines = raw.split(b"\n")
    if start > 0:
        lines = lines[1:]  # the first is a part of a line
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except (ValueError, RecursionError):
            continue  # a partial last line, or not a point
    by_step = {p["step"]: p for p in (stored_point(e) for e in entries) if p is not None}
    return [by_step[s] for s in sorted(by_step)]


def stored_point(d: Any) -> dict[str, Any] | None:
    """A point as written (by `start_curve`/`append_points`) and read back: {"step", *FIGURES}; None
    when it has no valid step."""
    step = d.get("step") if isinstance(d, Mapping) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        return None
    return {"step": step, **{name: _number(d.get(name)) for name in FIGURES}}
