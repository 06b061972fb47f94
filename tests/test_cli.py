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


def test_each_command_is_looked_up_in_the_modules_that_register_it() -> None:
    """`cli` imports a command's modules when it is used (app.COMMAND_MODULES), not at start-up: every
    command and subcommand the *_cmds modules register must be reachable that way, or a fresh
    `ggpo-batch` would not have it (`ledger export` is registered by report_cmds on ledger_cmds' group)."""
    import pkgutil
    from importlib import import_module

    import ggpo_batch.cli as package
    from ggpo_batch.cli.app import COMMAND_MODULES

    for found in pkgutil.iter_modules(package.__path__):
        if found.name.endswith("_cmds"):
            import_module(f"{package.__name__}.{found.name}")

    def registered_by(cmd) -> set[str]:  # type: ignore[no-untyped-def]
        modules = {cmd.callback.__module__.rsplit(".", 1)[-1]} if cmd.callback else set()
        for sub in getattr(cmd, "commands", {}).values():
            modules |= registered_by(sub)
        return modules

    assert set(cli.commands) == set(COMMAND_MODULES)
    for name, cmd in cli.commands.items():
        assert registered_by(cmd) <= set(COMMAND_MODULES[name]), name
