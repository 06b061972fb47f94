"""docs/reference/json/: one JSON Schema per `--json` kind at its current schema number
(`ggpo_batch/common/schema_types.json_schema`), made from the types `tests/test_json_schemas.py`
records for it (tests/data/json_types.json), and the schemas of the spec and the settings file
(`ggpo_batch/contracts/spec_fields.json_schema`, `ggpo_batch/config/settings_schema.json_schema`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TYPES = ROOT / "tests" / "data" / "json_types.json"


def text_of(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def document_schemas() -> dict[str, str]:
    """`json/<kind>.schema.json` -> its text, for each kind whose current number has recorded types."""
    from ggpo_batch.common.schema_types import json_schema
    from ggpo_batch.common.schemas import SCHEMAS

    recorded = json.loads(TYPES.read_text()) if TYPES.exists() else {}
    pages = {}
    for kind, schema in SCHEMAS.items():
        types = recorded.get(kind, {}).get(str(schema.number))
        if types is not None:
            pages[f"json/{kind}.schema.json"] = text_of(json_schema(kind, schema.number, types))
    return pages


def settings_schema() -> dict[str, Any]:
    """The settings file's JSON Schema (config.toml; ggpo_batch/config/files.py): every setting a command
    reads (`config.setting_names`) but the secrets, as its flat key (`queue_gpu_quota`) and in a table of
    its first words (`[notify] smtp_host`, `[notify.smtp] host`), with its meaning (tools/docs/settings_md.py)."""
    from ggpo_batch.config.files import PREFIX, is_secret
    from ggpo_batch.config.settings import setting_names
    from tools.docs.settings_md import SETTINGS

    value = {"type": ["string", "number", "boolean", "array"], "items": {"type": ["string", "number"]}}
    keys = {}
    for name in sorted(setting_names()):
        if is_secret(name):
            continue
        meaning = SETTINGS.get(name, ("", None))[0]
        keys[name.removeprefix(PREFIX).lower()] = {**value, "description": f"{name}: {meaning}".rstrip(": ")}

    def table(entries: dict[str, dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": dict(entries), "additionalProperties": False}
        heads = sorted({k.split("_", 1)[0] for k in entries if "_" in k})
        for head in heads:
            inner = {k.split("_", 1)[1]: v for k, v in entries.items() if k.startswith(head + "_")}
            sub = table(inner)
            if head in out["properties"]:  # a setting and a table of the same name: either
                out["properties"][head] = {"anyOf": [out["properties"][head], sub]}
            else:
                out["properties"][head] = sub
        return out

    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "ggpo-batch/settings",
            "title": "ggpo-batch settings file (config.toml)",
            "description": "/etc/ggpo-batch/config.toml or ~/.config/ggpo-batch/config.toml: the GGPO_* settings "
                           "in TOML, a key per setting (GGPO_QUEUE_GPU_QUOTA is queue_gpu_quota), secrets never "
                           "(their _file key names a 0600 file). Generated from the settings the commands read.",
            **table(keys)}


def contract_schemas() -> dict[str, str]:
    """`json/spec.schema.json` and `json/settings.schema.json` -> their texts."""
    from ggpo_batch.contracts.spec_schema import json_schema

    return {"json/spec.schema.json": text_of(json_schema()), "json/settings.schema.json": text_of(settings_schema())}
