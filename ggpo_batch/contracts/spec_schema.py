"""The experiment spec as a JSON Schema (draft 2020-12), made from the spec's field table
(`spec_fields.FIELDS`): each table's keys with their types, bounds, choices, defaults and meanings,
required keys, and no other key (the parser refuses one). Editors that read JSON Schemas for TOML
(taplo, VS Code's Even Better TOML) then complete and check a spec: its first line `#:schema PATH`
names `docs/reference/json/spec.schema.json`. The rules between keys stay the parser's."""

from __future__ import annotations

from typing import Any

from ..common import limits
from .spec_fields import REQUIRED, Field, fields_of

JSON_SCHEMA_DRAFT = "https://json-schema.org/draft/2020-12/schema"
_SCALARS = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean"}


def _bounds(f: Field) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if f.choices:
        out["enum"] = list(f.choices)
        return out
    if f.lo is not None:
        out["exclusiveMinimum" if f.open_lo else "minimum"] = _plain(f.lo)
    if f.hi is not None:
        out["exclusiveMaximum" if f.open_hi else "maximum"] = _plain(f.hi)
    return out


def _plain(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def _value(f: Field) -> dict[str, Any]:
    """The schema of one field's value."""
    kind = f.type
    if kind in _SCALARS:
        out: dict[str, Any] = {"type": _SCALARS[kind], **_bounds(f)}
        if kind == "string" and f.key.endswith(("experiment.name", "experiment.queue", "experiment.profile")):
            out["pattern"] = limits.NAME.pattern
    elif kind == "array of integers":
        out = {"type": "array", "items": {"type": "integer", **_bounds(f)}, "uniqueItems": True}
    elif kind == "array of strings":
        out = {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": limits.NAME_MAX},
               "uniqueItems": True}
    elif kind == "table":  # one with no fields of its own (an arm's `train` overrides): the parser checks it
        out = _table(f.key) if fields_of(f.key) else {"type": "object"}
    elif kind == "table of tables":
        out = {"type": "object", "propertyNames": {"pattern": limits.ARM_NAME.pattern},
               "additionalProperties": _table(f"{f.key}.<arm>")}
    elif kind == "array":
        out = {"type": "array", "minItems": 1, "uniqueItems": True}
    elif kind == 'number or "ledger"':
        out = {"anyOf": [{"type": "number", **_bounds(f)}, {"const": "ledger"}]}
    elif kind == "array of tables":
        out = {"type": "array", "items": _table(f"{f.key}[]")}
    elif kind == "inline table":
        out = {"type": "object"}
    elif kind == "string or array of strings":  # [train.task] reward: one, or several summed
        out = {"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string"}}]}
    elif kind == "array of numbers":
        out = {"type": "array", "items": {"type": "number"}}
    elif kind == 'true, false or "auto"':
        out = {"enum": [True, False, "auto"]}
    else:  # a type the field table gained: the schema must learn it (tests/test_spec_schema.py)
        raise ValueError(f"{f.key}: no JSON Schema for the field type {kind!r}")
    if f.max_items is not None:
        out["maxProperties" if out.get("type") == "object" else "maxItems"] = f.max_items
    if f.default is not REQUIRED and f.default is not None:
        out["default"] = f.default
    limit = f.limit_text().replace("\\|", "|").replace("`", "")
    out["description"] = f.meaning + (f" Limit: {limit}." if limit else "")
    return out


def _table(section: str) -> dict[str, Any]:
    """A table's schema: its keys; a `<placeholder>` key (`[sweep]`'s `<field>`) stands for any other key."""
    fields = [f for f in fields_of(section) if not f.name.startswith("<")]
    any_key = [f for f in fields_of(section) if f.name.startswith("<")]
    out: dict[str, Any] = {"type": "object", "properties": {f.name: _value(f) for f in fields},
                           "additionalProperties": _value(any_key[0]) if any_key else False}
    required = [f.name for f in fields if f.default is REQUIRED]
    if required:
        out["required"] = required
    return out


def json_schema() -> dict[str, Any]:
    """The spec file's JSON Schema (docs/reference/json/spec.schema.json)."""
    top = _table("")
    if "sweep" in top["properties"] and "arms" in top.get("required", []):  # a [sweep] may make every arm
        top["required"] = [k for k in top["required"] if k != "arms"]
        top["anyOf"] = [{"required": ["arms"]}, {"required": ["sweep"]}]
    return {"$schema": JSON_SCHEMA_DRAFT, "$id": "ggpo-batch/spec/1", "title": "ggpo-batch experiment spec",
            "description": "An experiment spec (jobs/*.toml); generated from ggpo_batch/contracts/spec_fields.py. "
                           "The rules between keys are checked by `ggpo-batch enqueue --dry-run`.",
            **top}
