"""Run a list of `ggpo-batch` commands, then GET a list of dashboard routes from a real server, in
one process, and print what each answered as JSON. The read-only ledger tests run it as a user
who may not write the ledger: one process start per case rather than one per command.

    python -m tests.support.cli_batch < job.json
    job: {"commands": [{"args": [...], "env": {...}}, ...], "routes": ["/api/status", ...]}
    out: {"plan": ..., "commands": [{"args", "exit", "stdout", "stderr", "bug"}], "routes": [[status, body]]}
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from click.testing import CliRunner


def run_commands(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from ggpo_batch.cli import cli

    runner = CliRunner()
    out = []
    for command in commands:
        res = runner.invoke(cli, command["args"], env=command.get("env"), catch_exceptions=True)
        bug = None if res.exception is None or isinstance(res.exception, SystemExit) else repr(res.exception)
        out.append({"args": command["args"], "exit": res.exit_code, "stdout": res.stdout, "stderr": res.stderr,
                    "bug": bug})
    return out


def get_routes(routes: list[str]) -> list[tuple[int, str]]:
    """GET each route from the dashboard app served by uvicorn on a free port of 127.0.0.1."""
    import uvicorn

    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.config.settings import load_settings
    from ggpo_batch.dashboard.routes import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(load_settings(), host="127.0.0.1"), host="127.0.0.1",
                                           port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SystemExit("the dashboard did not start")
        time.sleep(0.05)
    answers = []
    try:
        for route in routes:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{route}", timeout=60) as r:
                    answers.append((r.status, r.read().decode()))
            except urllib.error.HTTPError as e:
                answers.append((e.code, e.read().decode()))
    finally:
        server.should_exit = True
        thread.join(30)
    return answers


def main() -> None:
    job = json.load(sys.stdin)
    from ggpo_batch.config.settings import load_settings
    from ggpo_batch.ledger.read_only import plan_sqlite_read

    url = load_settings().db_url
    plan = plan_sqlite_read(Path(url.split(":///", 1)[1])).how if url.startswith("sqlite:///") else None
    result = {"plan": plan, "commands": run_commands(job.get("commands", [])),
              "routes": get_routes(job["routes"]) if job.get("routes") else []}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
