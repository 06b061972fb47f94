from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from tests.support.paths import SEED_000


def _run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_import_and_status_json(env: dict[str, str]) -> None:
    assert _run("db", "upgrade").exit_code == 0
    out = _run("ledger", "import", str(SEED_000))
    assert out.exit_code == 0 and "15 runs, 57.2974 allocated GPU-hours" in out.output
    res = _run("status", "--json")
    assert res.exit_code == 0
    [exp] = json.loads(res.output)["experiments"]
    assert exp["totals"]["states"] == {"succeeded": 15}
    assert exp["totals"]["allocated_gpu_hours"] == pytest.approx(57.29736219114727, rel=1e-12)
    assert {a: t["runs"] for a, t in exp["arms"].items()} == {
        "clean": 3, "paired": 3, "paired_answer": 3, "random_answer": 3, "random_matched": 3}
    table = _run("status")
    assert table.exit_code == 0
    assert "experiment total" in table.output and "57.2974" in table.output and "15 succeeded" in table.output
    filtered = json.loads(_run("status", "--json", "--state", "failed").output)
    assert filtered["experiments"] == []
    assert json.loads(_run("status", "--json", "-e", "nope").output)["experiments"] == []


def test_errors_are_one_line_and_exit_2(env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = _run("status")
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "run `ggpo-batch db upgrade`" in res.output
    _run("db", "upgrade")
    res = _run("ledger", "import", str(tmp_path / "missing.json"))
    assert res.exit_code == 2 and "missing.json: no such file" in res.output
    res = _run("status", "--state", "exploded")
    assert res.exit_code == 2 and "states are" in res.output


def test_help_teaches() -> None:
    res = _run("--help")
    assert res.exit_code == 0
    for word in ("enqueue", "worker", "status", "GGPO_DB_URL", "GGPO_REDIS_URL"):
        assert word in res.output


def test_password_never_printed(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGPO_DB_URL", "postgresql://ggpo:s3cr3t-pw@127.0.0.1:1/none")
    res = _run("db", "current")
    assert res.exit_code == 4 and "the ledger database is unavailable" in res.output
    assert "s3cr3t-pw" not in res.output
