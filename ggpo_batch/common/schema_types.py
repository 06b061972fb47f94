"""The types in the `--json` contract, beside its shapes (`schemas.py`): the JSON types each field of
a kind's document holds, and the JSON Schema (draft 2020-12) made from a kind's recorded shape and
types, which `docs/reference/json/` publishes and the test suite validates every document against.

Type keys are the shape's paths (`schemas.key_paths`: lists transparent, data keys folded to `*`),
plus `PATH[]` for the elements of a list at PATH (`runs[]`: object; `exposed_item_ids[]`: string).
A field that holds a whole number in one document and a fraction in another is a "number";
`tests/test_json_schemas.py` records each number's types once (`tests/data/json_types.json`,
append-only, like its shapes): a field whose type changes needs a new schema number. Any field
may hold null besides its types (not known, not applicable: which fields are null depends on the
data and the machine, so a record of nulls seen would fail documents it never saw). A field seen
only as null when its number's types were recorded has no type yet (`unknown`): any value passes,
and a later recording adds the types it is then seen with (that completes the record, it changes
no type seen before).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .schemas import SCHEMAS

JSON_SCHEMA_DRAFT = "https://json-schema.org/draft/2020-12/schema"
ITEMS = "[]"


def json_type(value: Any) -> str:
    """The JSON type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def normal_types(types: Iterable[str]) -> list[str]:
    """`types` sorted, "integer" folded into "number" when both occur (JSON has one number type)."""
    found = set(types)
    if "number" in found:
        found.discard("integer")
    return sorted(found)


def unknown(recorded: Iterable[str]) -> bool:
    """Whether a field's recorded types say nothing yet: it held only null when they were recorded
    (its schema then admits any value, and recording its types again may add the types it holds)."""
    return set(recorded) <= {"null"}


def admits(recorded: Iterable[str], seen: Iterable[str]) -> bool:
    """Whether a field recorded with `recorded` types may hold values of the `seen` types (null
    always: every field may say "not known" or "not applicable")."""
    allowed = set(recorded) | {"null"}
    return unknown(allowed) or all(t in allowed or (t == "integer" and "number" in allowed) for t in seen)


def type_paths(kind: str, document: Any) -> dict[str, set[str]]:
    """The JSON types at each type key of `document` (a `kind` document)."""
    schema = SCHEMAS[kind]
    maps = {tuple(m.split(".")) for m in schema.maps}
    opaque = {tuple(m.split(".")) for m in schema.opaque}
    out: dict[str, set[str]] = {}
    _types(document, (), "", maps, opaque, out)
    return out


def _types(value: Any, where: tuple[str, ...], key: str, maps: set[tuple[str, ...]],
           opaque: set[tuple[str, ...]], out: dict[str, set[str]]) -> None:
    if key:
        out.setdefault(key, set()).add(json_type(value))
    if where in opaque and key and not key.endswith(ITEMS):
        return  # another contract's value: its contents are not this one's
    if isinstance(value, list):
        for item in value:
            _types(item, where, key + ITEMS, maps, opaque, out)
        return
    if not isinstance(value, dict) or where in opaque:
        return
    keyed_by_data = any(len(where) == len(m) and all(p in ("*", w) for w, p in zip(where, m)) for m in maps)
    for name, item in value.items():
        path = (*where, "*" if keyed_by_data else str(name))
        _types(item, path, ".".join(path), maps, opaque, out)


def json_schema(kind: str, number: int, types: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """The JSON Schema of schema `number` of `kind` from its recorded `types` (which name every
    path of its shape): each object lists its fields and admits no other (a new field is a new
    number), a data-keyed map admits any key; an opaque field's contents are another contract's."""
    schema = SCHEMAS[kind]
    record = {k: normal_types(v) for k, v in types.items()}
    opaque = set(schema.opaque)
    def holds_objects(path: str) -> bool:  # an object at `path`, or in the lists there
        key = path
        while key in record:
            if "object" in record[key]:
                return True
            key += ITEMS
        return False

    children: dict[str, set[str]] = {}
    for key in record:
        if key.endswith(ITEMS):
            continue
        # A field's name may hold a dot (ledger export's flat `cost.rl_loss_tokens`): its parent is
        # the longest prefix that holds objects.
        steps = key.split(".")
        cut = next((i for i in range(len(steps) - 1, 0, -1) if holds_objects(".".join(steps[:i]))), 0)
        children.setdefault(".".join(steps[:cut]), set()).add(".".join(steps[cut:]))

    def object_part(path: str) -> dict[str, Any]:
        if path in opaque:
            return {}
        names = children.get(path, set())
        part: dict[str, Any] = {"properties": {n: node(f"{path}.{n}" if path else n, f"{path}.{n}" if path else n)
                                               for n in sorted(names - {"*"})}}
        part["additionalProperties"] = node(f"{path}.*", f"{path}.*") if "*" in names else False
        return part

    def node(path: str, key: str) -> dict[str, Any]:
        if path in opaque:
            return {"description": "a value of another contract (the spec's): any JSON"}
        kinds = record.get(key, [])
        if unknown(kinds):
            return {"description": "held only null when its types were recorded: any value"}
        kinds = normal_types([*kinds, "null"])  # every field may be null
        out: dict[str, Any] = {"type": kinds}
        if "object" in kinds:
            out.update(object_part(path))
        if "array" in kinds:
            out["items"] = node(path, key + ITEMS) if key + ITEMS in record else {}
        return out

    top = object_part("")
    top["properties"]["schema"] = {"const": number}
    return {"$schema": JSON_SCHEMA_DRAFT, "$id": f"ggpo-batch/{kind}/{number}",
            "title": f"ggpo-batch `{kind}` document, schema {number}",
            "description": f"{schema.description} Printed by: {schema.produced_by}.",
            "type": "object", "required": ["schema"], **top}
