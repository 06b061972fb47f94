"""Who acted, on SQLite: the OS user of the process (its uid, not $USER), and GGPO_USER names someone
else only for the ledger file's owner (or root). PostgreSQL's side (the connection's role) is
tests/test_team_ledger.py."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from ggpo_batch.config.settings import load_settings
from ggpo_batch.errors import ConfigError
from tests.dashboard.server import cli_env, ggpo

NOBODY = 65534


def test_role_gpu_quota_are_read_and_refused_in_one_line() -> None:
    settings = load_settings({"GGPO_DATA_DIR": "/tmp/x", "GGPO_USER_GPU_QUOTA": "8",
                              "GGPO_ROLE_GPU_QUOTA": "ggpo_lead=16, ggpo_member=4"})
    assert settings.user_gpu_quota == 8
    assert settings.role_gpu_quota == (("ggpo_lead", 16), ("ggpo_member", 4))
    for bad in ("ggpo_lead", "ggpo_lead=x", "ggpo_lead=-1", "two words=3", "=4"):
        with pytest.raises(ConfigError, match="GGPO_ROLE_GPU_QUOTA"):
            load_settings({"GGPO_DATA_DIR": "/tmp/x", "GGPO_ROLE_GPU_QUOTA": bad})


@pytest.mark.slow
def test_on_sqlite_the_actor_is_the_os_user_and_only_the_owner_names_someone_else() -> None:
    """A ledger root made in a folder anyone may write: the OS user nobody writes to it as nobody,
    whatever $USER says; naming alice is refused (exit 6, one line, nothing written); root, the
    file's owner, may still name who it acts for."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as another OS user")
    folder = Path(tempfile.mkdtemp(prefix="ggpo-identity-"))
    try:
        folder.chmod(0o777)
        ledger = folder / "ledger.sqlite3"
        owner = cli_env(GGPO_DB_URL=f"sqlite:///{ledger}", GGPO_DATA_DIR=str(folder / "data"),
                        GGPO_REDIS_URL="memory://", PYTHONDONTWRITEBYTECODE="1")
        assert ggpo(owner, "db", "upgrade").returncode == 0
        ledger.chmod(0o666)
        (folder / "data").mkdir(mode=0o777)
        (folder / "data").chmod(0o777)
        assert not Path(f"{ledger}-wal").exists()  # the last connection checkpointed it away
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

        def decide(env: dict[str, str], name: str, *, as_nobody: bool):  # type: ignore[no-untyped-def]
            import subprocess
            import sys

            argv = [sys.executable, "-m", "ggpo_batch.cli", "decide", name, "--not-reproduced", "--reason", "r",
                    "--cost-basis", "c"]
            return subprocess.run([*prefix, *argv] if as_nobody else argv, env=env, capture_output=True, text=True,
                                  timeout=120, check=False, cwd=folder)

        def decided() -> list[tuple[str, str]]:
            with sqlite3.connect(ledger) as conn:
                return sorted(conn.execute("SELECT experiment_name, decided_by FROM decisions"))

        claims = {**owner, "USER": "alice", "LOGNAME": "alice"}  # self-declared: not who acts
        done = decide(claims, "by-nobody", as_nobody=True)
        assert done.returncode == 0, done.stderr
        refused = decide({**claims, "GGPO_USER": "alice"}, "as-alice", as_nobody=True)
        assert refused.returncode == 6, refused.stderr
        assert refused.stderr.strip().splitlines() == [
            ("error: not permitted: acting as 'alice' (GGPO_USER), on this SQLite ledger you are the OS user 'nobody': "
             "only the ledger file's owner (or root) may name someone else; unset GGPO_USER")]
        done = decide({**owner, "GGPO_USER": "tester"}, "by-root-as-tester", as_nobody=False)
        assert done.returncode == 0, done.stderr
        assert decided() == [("by-nobody", "nobody"), ("by-root-as-tester", "tester")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
