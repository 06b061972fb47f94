"""Arms over any training field: an arm's `[arms.NAME.train]` overrides, and `[sweep]`, the grid of
training fields that expands into arms of its own.

Each arm's train is the spec's `[train]` with its overrides laid over it (contracts/arm_train.py),
validated exactly as `[train]` is, an error naming the arm and the field (`arms.lr_hi.train.lr`).
What every arm shares is refused in an override or a sweep (spec_fields.SAME_FOR_EVERY_ARM: arms are
paired on the same items and the same reward). An override equal to the spec's own value changes
nothing, so it is dropped: a run's config hash differs from the baseline's only where its train does.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from ..common import limits
from ..contracts import spec_fields
from ..contracts.arm_train import NESTED, difference, overlay
from ..errors import SpecError

MAX_ARMS = spec_fields.most("arms")
MAX_SWEEP_FIELDS = spec_fields.most("sweep")
MAX_SWEEP_VALUES = spec_fields.most("sweep.<field>")
SAME = frozenset(spec_fields.SAME_FOR_EVERY_ARM)
_WHY = "arms are paired on the same items and the same reward: set it in [train], for every arm"
HASH_CHARS = 8  # the suffix of a swept arm's name that is too long or not unique

Validate = Callable[[Mapping[str, Any]], dict[str, Any]]  # a raw [train] table -> the run spec's train


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


def override_table(p: str, where: str, table: Any) -> dict[str, Any]:
    """`[arms.NAME.train]` as written, its shape checked: a table; no field every arm shares; the
    `model` sub-table a table (its keys and values are checked with the merged train)."""
    if not isinstance(table, dict):
        raise SpecError(p, where, f"must be a table, got {_kind(table)}")
    for key, value in table.items():
        if f"train.{key}" in SAME:
            raise SpecError(p, f"{where}.{key}", f"cannot be set per arm ({_WHY})")
        if key in NESTED and not isinstance(value, dict):
            raise SpecError(p, f"{where}.{key}", f"must be a table ([{where}.{key}]), got {_kind(value)}")
    return dict(table)


def arm_train(p: str, where: str, base_raw: Mapping[str, Any], overrides: Mapping[str, Any],
              validate: Validate) -> dict[str, Any]:
    """The run spec's train of an arm whose overrides are `overrides` (validated as `[train]`, a
    problem named `{where}.<field>`), the overrides equal to the spec's own values dropped."""
    from ..train.config import TrainConfig

    def checked(table: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return validate(table)
        except SpecError as exc:
            field = exc.field.removeprefix("train")
            raise SpecError(p, f"{where}{field}", exc.problem) from None

    merged = checked(overlay(base_raw, overrides))
    base = TrainConfig.from_table(validate(base_raw), p)
    mine = TrainConfig.from_table(merged, p)
    kept: dict[str, Any] = {}
    for key, value in overrides.items():
        if key in NESTED and isinstance(value, Mapping):
            theirs, ours = getattr(base, key), getattr(mine, key)
            inner = {k: v for k, v in value.items() if theirs is None or getattr(theirs, k) != getattr(ours, k)}
            if inner:
                kept[key] = inner
        elif getattr(base, key) != getattr(mine, key):
            kept[key] = value
    return checked(overlay(base_raw, kept))


# -- [sweep] ------------------------------------------------------------------------------------------


def sweep_fields(p: str, table: Any) -> dict[str, list[Any]]:
    """`[sweep]` checked for its shape: each key a quoted dotted `train.KEY` or `train.model.KEY` of
    a field an arm may override, each value a non-empty array of distinct plain values."""
    if not isinstance(table, dict):
        raise SpecError(p, "sweep", f"must be a table, got {_kind(table)}")
    if not table:
        raise SpecError(p, "sweep", "is empty: list at least one \"train.KEY\" = [values]")
    if len(table) > MAX_SWEEP_FIELDS:
        raise SpecError(p, "sweep", f"sweeps {len(table)} fields; at most {MAX_SWEEP_FIELDS}")
    train_keys = spec_fields.keys("train") - set(NESTED)
    model_keys = spec_fields.keys("train.model")
    out: dict[str, list[Any]] = {}
    for key, values in table.items():
        at = f'sweep."{key}"'
        if isinstance(values, dict):
            raise SpecError(p, f"sweep.{key}", f"is a table: quote the dotted field, \"{key}.<key>\" = [values]")
        parts = key.split(".")
        if key in SAME or any(key.startswith(f"{s}.") for s in SAME):
            raise SpecError(p, at, f"cannot be swept ({_WHY})")
        ok = (len(parts) == 2 and parts[0] == "train" and parts[1] in train_keys) or \
             (len(parts) == 3 and parts[:2] == ["train", "model"] and parts[2] in model_keys)
        if not ok:
            raise SpecError(p, at, "is not a field an arm may override (\"train.KEY\" or \"train.model.KEY\" of "
                            "docs/reference/spec.md)")
        if not isinstance(values, list) or not values:
            raise SpecError(p, at, "must be a non-empty array of values")
        if len(values) > MAX_SWEEP_VALUES:
            raise SpecError(p, at, f"has {len(values)} values; at most {MAX_SWEEP_VALUES}")
        for i, v in enumerate(values):
            if isinstance(v, (dict, list)) or (isinstance(v, float) and not math.isfinite(v)):
                raise SpecError(p, f"{at}[{i}]", f"must be a plain value, got {_kind(v)}")
        shown = [json.dumps(v) for v in values]
        dup = sorted({s for s in shown if shown.count(s) > 1})
        if dup:
            raise SpecError(p, at, f"duplicate value(s) {', '.join(dup)}")
        out[key] = list(values)
    return out


def sweep_size(sweep: Mapping[str, list[Any]]) -> int:
    return math.prod(len(v) for v in sweep.values())


def check_arm_count(p: str, explicit: int, sweep: Mapping[str, list[Any]] | None) -> None:
    """At most MAX_ARMS arms, explicit and swept together; the refusal names the count."""
    if not sweep:
        if explicit > MAX_ARMS:
            raise SpecError(p, "arms", f"has {explicit} arms; at most {MAX_ARMS}")
        return
    n = sweep_size(sweep)
    if explicit + n > MAX_ARMS:
        grid = " x ".join(str(len(v)) for v in sweep.values())
        raise SpecError(p, "sweep", f"makes {grid} = {n} arms, with the {explicit} explicit arm(s) {explicit + n}; "
                        f"at most {MAX_ARMS}")


def sweep_arms(p: str, sweep: Mapping[str, list[Any]], explicit: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(name, overrides) of each point of the grid, in the order of the sweep's fields and values;
    the names deterministic, unique, within the arm-name rule, none an explicit arm's."""
    keys = list(sweep)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*(sweep[k] for k in keys))]
    plain = [arm_name(point) for point in points]
    counts = {n: plain.count(n) for n in plain}
    names = [n if counts[n] == 1 and len(n) <= limits.ARM_NAME_MAX and limits.ARM_NAME.match(n)
             else hashed_name(n, point) for n, point in zip(plain, points)]
    out = []
    for name, point in zip(names, points):
        if name in explicit:
            raise SpecError(p, "sweep", f"makes arm {name!r} ({_point_text(point)}), the name of an explicit "
                            f"[arms.{name}]: rename that arm")
        overrides: dict[str, Any] = {}
        for key, value in point.items():
            parts = key.split(".")[1:]
            if len(parts) == 2:
                overrides.setdefault(parts[0], {})[parts[1]] = value
            else:
                overrides[parts[0]] = value
        out.append((name, overrides))
    return out


def arm_name(point: Mapping[str, Any]) -> str:
    """`lr_1em06__kl_coef_0p001`: each swept field (after `train.`, dots as `_`) and its value
    (`-` as `m`, `.` as `p`, `+` dropped, anything else outside [A-Za-z0-9_] as `_`), `__` between."""
    return "__".join(f"{key.removeprefix('train.').replace('.', '_')}_{_value_text(v)}" for key, v in point.items())


def hashed_name(name: str, point: Mapping[str, Any]) -> str:
    """`name` cut to leave room for `_` and a hash of the point (when it is too long, or two points
    would share it)."""
    digest = hashlib.sha256(json.dumps(point, sort_keys=True).encode()).hexdigest()[:HASH_CHARS]
    head = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)
    head = head[:limits.ARM_NAME_MAX - HASH_CHARS - 1].rstrip("_") or "sweep"
    if not head[0].isalnum():
        head = "s" + head
    return f"{head}_{digest}"


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    text = repr(v) if isinstance(v, float) else str(v)
    text = text.replace("-", "m").replace(".", "p").replace("+", "")
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text)


def _point_text(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} = {json.dumps(v)}" for k, v in point.items())


def check_sweep_values(p: str, sweep: Mapping[str, list[Any]], base_raw: Mapping[str, Any],
                       validate: Validate) -> None:
    """Each swept value on its own over the spec's [train] (a problem named `sweep."train.lr"[1]`),
    before the grid's combinations (whose problems name their arm)."""
    for key, values in sweep.items():
        parts = key.split(".")[1:]
        for i, v in enumerate(values):
            ov: dict[str, Any] = {parts[0]: {parts[1]: v}} if len(parts) == 2 else {parts[0]: v}
            try:
                validate(overlay(base_raw, ov))
            except SpecError as exc:
                raise SpecError(p, f'sweep."{key}"[{i}]', f"{exc.field}: {exc.problem}") from None


def effective_overrides(base: Mapping[str, Any], trains: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Arm -> its overrides as the difference of its train from the spec's (arms that change nothing
    left out)."""
    out = {}
    for name, train in trains.items():
        d = difference(base, train)
        if d:
            out[name] = d
    return out

