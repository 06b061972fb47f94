"""`ggpo-batch init [DIR]` (ggpo_batch/spec/starter.py) and the install smoke check (ggpo_batch/smoke.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch import smoke
from ggpo_batch.cli import cli
from ggpo_batch.common import datafiles
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import PACKAGED


def _run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_init_writes_a_spec_that_passes_dry_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("GGPO_")]:
        monkeypatch.delenv(key)
    for key, value in {"GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_REDIS_URL": "memory://", "GGPO_USER": "tester",
                       "XDG_CONFIG_HOME": str(tmp_path / "xdg")}.items():
        monkeypatch.setenv(key, value)
    folder = tmp_path / "exp"
    done = _run("init", str(folder))
    assert done.exit_code == 0, done.output
    written = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert written == {"experiment.toml", "profiles/my-cluster.toml", "data/train.jsonl", "data/eval.jsonl",
                       "data/passages.jsonl", "examples/demo-cpu.toml", "examples/exposure-5arm.toml"}
    spec = load_spec(folder / "experiment.toml")
    assert spec.train["data"]["train"] == str(folder / "data" / "train.jsonl")  # relative to the spec file
    profile = (folder / "profiles" / "my-cluster.toml").read_text()
    assert str(tmp_path / "xdg" / "ggpo-batch" / "profiles") in profile  # where to install it
    assert profile.endswith((PACKAGED / "profiles" / "default.toml").read_text())
    # as written, from another folder: the spec's paths do not depend on the current one
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert _run("db", "upgrade").exit_code == 0
    dry = _run("enqueue", str(folder / "experiment.toml"), "--dry-run")
    assert dry.exit_code == 0 and "preflight: ok (32 train / 16 eval items" in dry.output, dry.output


def test_init_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    folder = tmp_path / "exp"
    assert _run("init", str(folder)).exit_code == 0
    spec = folder / "experiment.toml"
    spec.write_text("# mine\n")
    (folder / "data" / "eval.jsonl").unlink()
    again = _run("init", str(folder))
    assert again.exit_code == 2 and again.output.count("\n") == 1, again.output
    assert f"{spec}: exists (and 5 more); nothing written (--force replaces them)" in again.output
    assert spec.read_text() == "# mine\n" and not (folder / "data" / "eval.jsonl").exists()  # nothing written
    assert _run("init", str(folder), "--force").exit_code == 0
    assert spec.read_bytes() == (PACKAGED / "starter" / "experiment.toml").read_bytes()
    assert (folder / "data" / "eval.jsonl").is_file()
    (tmp_path / "a-file").write_text("")
    not_a_folder = _run("init", str(tmp_path / "a-file"))
    assert not_a_folder.exit_code == 2 and "a-file: exists and is not a folder" in not_a_folder.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_init_into_a_folder_it_cannot_write_is_one_line(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    done = _run("init", str(locked / "exp"))
    assert done.exit_code == 2 and "cannot write (Permission denied)" in done.output


def test_help_names_where_profiles_are_looked_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    from ggpo_batch.cli import init_cmds

    text = init_cmds._help()
    for folder in datafiles.search_path("profiles"):
        assert str(folder.parent) in text


def test_smoke_passes_here_and_fails_without_the_migrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert smoke.main([]) == 0
    assert "smoke: 5 of 5 checks passed" in capsys.readouterr().out
    from ggpo_batch.ledger import db

    monkeypatch.setattr(db, "MIGRATIONS_DIR", tmp_path / "no-migrations")  # a wheel built without them
    monkeypatch.setattr(datafiles, "EXAMPLES_DIR", tmp_path / "no-examples")
    assert smoke.main([]) == 1
    out = capsys.readouterr().out
    assert "FAIL  ledger:" in out and "FAIL  examples:" in out and "smoke: 3 of 5 checks passed" in out


def test_init_force_replaces_links_and_never_writes_through_them(tmp_path: Path) -> None:
    """A link in a target's place (to a file outside, or dangling) is replaced by the file; the
    link's target is untouched and nothing is created outside the folder."""
    folder = tmp_path / "exp"
    assert _run("init", str(folder)).exit_code == 0
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me\n")
    (folder / "experiment.toml").unlink()
    (folder / "experiment.toml").symlink_to(outside)
    (folder / "data" / "eval.jsonl").unlink()
    (folder / "data" / "eval.jsonl").symlink_to(tmp_path / "dangling.jsonl")
    done = _run("init", str(folder), "--force")
    assert done.exit_code == 0, done.output
    assert outside.read_text() == "keep me\n" and not (tmp_path / "dangling.jsonl").exists()
    assert not (folder / "experiment.toml").is_symlink() and not (folder / "data" / "eval.jsonl").is_symlink()
    assert (folder / "experiment.toml").read_bytes() == (PACKAGED / "starter" / "experiment.toml").read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["data", "examples", "experiment.toml", "profiles"]


def test_init_names_a_fifo_or_a_linked_folder_in_its_place(tmp_path: Path) -> None:
    folder = tmp_path / "exp"
    assert _run("init", str(folder)).exit_code == 0
    spec = folder / "experiment.toml"
    spec.unlink()
    os.mkfifo(spec)
    done = _run("init", str(folder), "--force")
    assert done.exit_code == 2 and done.output.count("\n") == 1, done.output
    assert f"{spec}: a FIFO is there, not a file" in done.output and "None" not in done.output
    spec.unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "data").rename(tmp_path / "old-data")
    (folder / "data").symlink_to(elsewhere)
    linked = _run("init", str(folder), "--force")
    assert linked.exit_code == 2 and f"{folder / 'data'}: is a link" in linked.output, linked.output
    assert list(elsewhere.iterdir()) == [] and not spec.exists()  # nothing written
