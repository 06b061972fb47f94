"""`ggpo-batch dashboard` on the command line: the bind rule (exit 2), --help, no torch at start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.dashboard.server import cli_env, ggpo
from tests.support.paths import REPO


def test_a_non_local_bind_without_a_token_is_refused_with_exit_2(tmp_path: Path) -> None:
    env = cli_env(GGPO_DB_URL=f"sqlite:///{tmp_path / 'l.sqlite3'}", GGPO_DATA_DIR=str(tmp_path))
    done = ggpo(env, "dashboard", "--host", "0.0.0.0", "--port", "1")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: ggpo-batch dashboard: --host 0.0.0.0 is not a loopback address")
    assert "set GGPO_DASHBOARD_TOKEN" in line
    assert not (tmp_path / "l.sqlite3").exists()  # refused before the ledger was opened


def test_a_malformed_token_is_refused_with_exit_2_and_not_shown(tmp_path: Path) -> None:
    env = cli_env(GGPO_DB_URL=f"sqlite:///{tmp_path / 'l.sqlite3'}", GGPO_DASHBOARD_TOKEN="tooShort99")
    done = ggpo(env, "dashboard", "--host", "0.0.0.0")
    assert done.returncode == 2
    assert "GGPO_DASHBOARD_TOKEN: must be at least 16 characters" in done.stderr
    assert "tooShort99" not in done.stderr + done.stdout


def test_help_teaches_the_options_and_the_token_rule() -> None:
    done = ggpo(cli_env(), "dashboard", "--help")
    assert done.returncode == 0
    for needle in ("--host", "[default: 127.0.0.1]", "--port", "[default: 8265", "GGPO_DASHBOARD_TOKEN",
                   "Authorization: Bearer TOKEN", "?token=TOKEN", "/api/status", "exit 2"):
        assert needle in done.stdout, needle


SERVE_EVERY_PAGE = """
import sys, threading, time, urllib.request, urllib.error
import uvicorn
from ggpo_batch.config.settings import load_settings
from ggpo_batch.dashboard.routes import create_app
server = uvicorn.Server(uvicorn.Config(create_app(load_settings()), host="127.0.0.1", port=0, log_level="error"))
threading.Thread(target=server.run, daemon=True).start()
while not server.started:
    time.sleep(0.05)
port = server.servers[0].sockets[0].getsockname()[1]
codes = []
for path in ["/", "/experiments/exp", "/runs/exp-v1-20261012-clean", "/nightly", "/api/status", "/api/components",
             "/static/dashboard.js"]:
    try:
        codes.append(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
server.should_exit = True
print(codes, "torch" in sys.modules)
"""


@pytest.mark.redis
@pytest.mark.slow  # about 8 s: a server in a subprocess, every page rendered
def test_serving_every_page_never_imports_torch(cli: dict[str, str]) -> None:
    done = ggpo(cli, "ledger", "import", str(REPO / "tests/data/000_b2e3fe1f0148d43c.txt"), "--name", "exp")
    assert done.returncode == 0, done.stderr
    run = subprocess.run([sys.executable, "-c", SERVE_EVERY_PAGE], env=cli, cwd=REPO, capture_output=True, text=True,
                         timeout=180, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    codes, torch_loaded = run.stdout.strip().rsplit(" ", 1)
    assert codes == "[200, 200, 200, 200, 200, 200, 200]", run.stdout
    assert torch_loaded == "False"
