"""An arm's `[train]`: the spec's `[train]` table with the arm's overrides laid over it, and what one
arm changes against another.

One home for the three places that must agree: the spec (`spec/arms.py` writes each arm's overrides
as the difference of its train from the spec's, `ExperimentSpec.train_of` lays them back over it for
the run spec), the canonical spec the ledger stores (each arm's `train` entry, present only where the
arm changes something) and what `status`, `report` and the dashboard say each arm changes against
the baseline (`arm_changes`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from . import spec_fields

# Sub-tables of [train] an override reaches into key by key ([arms.A.train.model] changes one key of
# [train.model], the others stay the spec's).
NESTED = ("model",)
# The arm's own fields (exposure and the rest), said as changes beside its train overrides.
ARM_FIELDS = ("exposure", "exposed_items", "templates", "auxiliary_answer_loss")


def overlay(train: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`train` with `overrides` laid over it: a nested table merged key by key, a None value removing
    the key (a key the spec's train has and the arm's does not, `difference`)."""
    out = dict(train)
    for key, value in overrides.items():
        if key in NESTED and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = overlay(out[key], value)
        elif value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def difference(base: Mapping[str, Any], train: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides that make `train` out of `base` (`overlay(base, difference(base, train)) ==
    train`): the keys whose values differ, nested tables key by key, None for a key `train` lacks."""
    out: dict[str, Any] = {}
    for key in sorted(set(base) | set(train)):
        a, b = base.get(key), train.get(key)
        if key not in train:
            out[key] = None
        elif key in NESTED and isinstance(a, Mapping) and isinstance(b, Mapping):
            inner = difference(a, b)
            if inner:
                out[key] = inner
        elif key not in base or _canon(a) != _canon(b):
            out[key] = b
    return out


def flat(table: Mapping[str, Any], prefix: str = "train.") -> dict[str, Any]:
    """`{"train.lr": 1e-6, "train.model.dtype": "float32"}` of a (nested) train table."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in NESTED and isinstance(value, Mapping):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def arm_changes(spec: Mapping[str, Any], arm: str, baseline: str | None) -> dict[str, list[Any]]:
    """What `arm` changes against `baseline` in a canonical spec (`ExperimentSpec.canonical`, as the
    ledger stores it): dotted field -> [baseline's value, arm's value], its train overrides
    (`train.lr`) and its own fields (`exposure`); {} for the baseline itself, an unknown arm, or a
    spec without arms (an imported record)."""
    arms = {a.get("name"): a for a in spec.get("arms") or () if isinstance(a, Mapping)}
    mine, base = arms.get(arm), arms.get(baseline)
    if mine is None or base is None or arm == baseline:
        return {}
    out: dict[str, list[Any]] = {}
    for key in ARM_FIELDS:
        if _canon(mine.get(key)) != _canon(base.get(key)):
            out[key] = [base.get(key), mine.get(key)]
    a, b = flat(base.get("train") or {}), flat(mine.get("train") or {})
    # Each side's overrides against the spec's [train]: a key one side leaves alone has the spec's
    # value, or the field's default where the spec leaves it out too.
    common = flat(spec.get("train") or {})
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, common.get(key, _default(key))), b.get(key, common.get(key, _default(key)))
        if _canon(old) != _canon(new):
            out[key] = [old, new]
    return out


def changes_text(changes: Mapping[str, list[Any]]) -> str:
    """`train.lr 0.001 -> 1e-06, train.kl_coef 0.02 -> 0` ("-" when nothing changes)."""
    if not changes:
        return "-"
    return ", ".join(f"{k} {_shown(v[0])} -> {_shown(v[1])}" for k, v in changes.items())


def _default(key: str) -> Any:
    """The field's default (spec_fields.py), None where it has none to show (required, or "absent")."""
    f = spec_fields.BY_KEY.get(key)
    return None if f is None or f.default is spec_fields.REQUIRED else spec_fields.default(key)


def _shown(value: Any) -> str:
    return "(none)" if value is None else json.dumps(value)


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
