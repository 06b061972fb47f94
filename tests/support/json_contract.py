"""Every `--json` document a test makes in its own process is validated against its published JSON
Schema (docs/reference/json/KIND.schema.json) with jsonschema: a pytest plugin (setup.cfg's
addopts: `-p tests.support.json_contract`) wraps `ggpo_batch.common.schemas.versioned`, the one
function every document passes through (the CLI's `echo_json`, the dashboard's API, the webhook
payload), and fails the test during which a document broke its schema. Streamed documents
(`status --json`, `ledger export --format json`) and those printed by other processes are
validated whole by tests/test_json_schemas.py, which makes every kind."""

from __future__ import annotations

import functools
import json
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any

import pytest

PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "reference" / "json"
_BROKEN: list[str] = []


@functools.cache
def _validator(kind: str):  # type: ignore[no-untyped-def]
    from jsonschema import Draft202012Validator

    path = PUBLISHED / f"{kind}.schema.json"
    if not path.exists():
        return None
    return Draft202012Validator(json.loads(path.read_text()))


def problems_of(kind: str, document: Any) -> list[str]:
    """Where `document` (decoded JSON) breaks the published schema of `kind`, one line each."""
    validator = _validator(kind)
    if validator is None:
        return [f"{kind}: no published schema {PUBLISHED / (kind + '.schema.json')} (python tools/docs/reference.py)"]
    return [f"{kind} schema {document.get('schema') if isinstance(document, dict) else '?'}: "
            f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:300]}"
            for e in validator.iter_errors(document)]


def _checked(versioned):  # type: ignore[no-untyped-def]
    @functools.wraps(versioned)
    def checked(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        document = versioned(kind, payload)
        try:
            printed = json.loads(json.dumps(document, default=str))  # as it is printed
        except (TypeError, ValueError) as exc:
            _BROKEN.append(f"{kind}: not JSON ({exc})")
        else:
            _BROKEN.extend(problems_of(kind, printed))
        return document

    checked.json_contract_checked = True  # type: ignore[attr-defined]
    return checked


def pytest_configure(config: pytest.Config) -> None:
    from ggpo_batch.common import schemas

    if not getattr(schemas.versioned, "json_contract_checked", False):
        schemas.versioned = _checked(schemas.versioned)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    _BROKEN.clear()
    result = yield
    if _BROKEN:
        broken, _BROKEN[:] = list(_BROKEN), []
        raise AssertionError("a --json document breaks its published schema (docs/reference/json/):\n"
                             + "\n".join(broken[:20]))
    return result
