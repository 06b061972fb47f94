from __future__ import annotations

import json
import shlex
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import os

    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("GGPO_DB_URL", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    monkeypatch.setenv("GGPO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GGPO_USER", "tester")
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    return runner


@pytest.mark.slow
def test_nightly_then_status_components(cli_env: CliRunner, tiny_suite_path: Path, tmp_path: Path):
    # Yesterday, not a fixed date: `status --nights 3` shows a window that ends today.
    night = (datetime.now(UTC).date() - timedelta(days=1)).isoformat()
    out = tmp_path / "rec.json"
    args = ["nightly", "--suite", str(tiny_suite_path), "--seeds", "5,6", "--output", str(out), "--night", night]
    res = cli_env.invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert f"ggpo {night}: {out} sha256 " in res.output
    rec = json.loads(out.read_text())
    # The command is the one given to the CLI, not the test runner's sys.argv.
    assert rec["seeds"] == [5, 6] and rec["provenance"]["command"] == shlex.join(["ggpo-batch", *args])
    res = cli_env.invoke(cli, ["nightly", "--suite", str(tiny_suite_path), "--night", night])
    assert res.exit_code == 0 and "already claimed by tester (succeeded); nothing run" in res.output
    res = cli_env.invoke(cli, ["status", "--components", "--json", "--nights", "3"])
    assert res.exit_code == 0, res.output
    [m] = json.loads(res.output)["components"]["methods"]
    assert m["method"] == "ggpo" and m["nights"][0]["night"] == night and m["nights"][0]["state"] == "succeeded"
    res = cli_env.invoke(cli, ["status", "--components"])
    assert res.exit_code == 0 and "nightly ggpo since" in res.output and night in res.output


@pytest.mark.parametrize("args, needle", [
    (["--seeds", "4,x"], "comma-separated integers"),
    (["--methods", "sif"], "unknown method 'sif'"),
    (["--corpus-sha256", "0" * 64], "expected " + "0" * 64),
])
def test_bad_input_exits_2_with_one_line(cli_env: CliRunner, tiny_suite_path: Path, args, needle):
    res = cli_env.invoke(cli, ["nightly", "--suite", str(tiny_suite_path), *args])
    assert res.exit_code == 2 and needle in res.output, res.output
