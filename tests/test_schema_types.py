"""The types of the `--json` contract (ggpo_batch/common/schema_types.py): a planted change of a
field's type under the same schema number is caught, by the record's check and by the published
JSON Schema, and the suite's plugin fails a test whose document breaks its schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ggpo_batch.common import schema_types, schemas
from tests import test_json_schemas as contract
from tests.support import json_contract

STATUS = schemas.SCHEMAS["status"].number


def _status(gpus: Any = 4, max_gpu_hours: Any = None) -> dict[str, Any]:
    run = {"run_key": "k", "state": "queued"}
    return {"schema": STATUS, "experiments": [{"experiment": "e", "gpus": gpus, "max_gpu_hours": max_gpu_hours,
                                               "arms": {"a": {"runs": 1, "states": {"queued": 1}}}, "runs": [run]}],
            "decided": []}


def test_types_follow_the_shape_with_list_elements_and_data_keys() -> None:
    types = schema_types.type_paths("status", _status())
    assert types["experiments"] == {"array"} and types["experiments[]"] == {"object"}
    assert types["experiments.gpus"] == {"integer"} and types["experiments.arms.*.states.*"] == {"integer"}
    assert set(types) - {k for k in types if k.endswith("[]")} == schemas.key_paths("status", _status())


def test_a_changed_type_under_the_same_number_is_caught() -> None:
    """gpus recorded as a whole number: a string there fails the record's check and the published
    schema; a fraction where "number" is recorded, or a value where only null was seen, does not."""
    recorded = contract._recorded_types()
    assert recorded["status"][str(STATUS)]["experiments.gpus"] == ["integer"]
    assert contract._type_problems({"status": [_status()]}, json.loads(json.dumps(recorded))) == []
    [problem] = contract._type_problems({"status": [_status(gpus="4")]}, json.loads(json.dumps(recorded)))
    assert "experiments.gpus of schema" in problem and "seen ['string']" in problem and "new number" in problem
    assert any("experiments.0.gpus" in p for p in json_contract.problems_of("status", _status(gpus="4")))
    assert json_contract.problems_of("status", _status()) == []
    assert schema_types.admits(["null", "number"], {"integer"}) and schema_types.admits(["null"], {"string"})
    assert not schema_types.admits(["integer"], {"number"})
    assert schema_types.admits(["string"], {"null"})  # any field may be null
    assert json_contract.problems_of("status", _status(gpus=None)) == []


def test_a_new_field_or_number_breaks_the_published_schema() -> None:
    extra = _status()
    extra["experiments"][0]["new_field"] = 1
    assert any("new_field" in p for p in json_contract.problems_of("status", extra))
    assert any("schema" in p for p in json_contract.problems_of("status", {**_status(), "schema": STATUS + 1}))


def test_the_plugin_fails_the_test_whose_document_breaks_its_schema() -> None:
    """schemas.versioned, wrapped by tests/support/json_contract.py: a broken document is noted
    (the plugin then fails the test that made it); here the note is taken back after checking it."""
    assert getattr(schemas.versioned, "json_contract_checked", False)
    schemas.dumps("db_current", {"current": 12, "head": "0010", "surplus": True})
    broken, json_contract._BROKEN[:] = list(json_contract._BROKEN), []
    assert broken and all(p.startswith("db_current schema") for p in broken)


def test_every_kind_has_a_published_schema_that_jsonschema_accepts() -> None:
    from jsonschema import Draft202012Validator

    for kind, schema in schemas.SCHEMAS.items():
        published = json.loads((json_contract.PUBLISHED / f"{kind}.schema.json").read_text())
        Draft202012Validator.check_schema(published)
        assert published["properties"]["schema"] == {"const": schema.number}, kind


@pytest.mark.parametrize("kind", ["ledger_export"])
def test_a_field_name_with_a_dot_is_a_field_not_a_path(kind: str) -> None:
    """ledger export's flat rows have keys like `cost.rl_loss_tokens`: one field of the row."""
    published = json.loads((json_contract.PUBLISHED / f"{kind}.schema.json").read_text())
    row = published["properties"]["runs"]["items"]["properties"]
    assert any("." in name for name in row)
