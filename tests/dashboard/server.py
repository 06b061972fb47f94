"""A real `ggpo-batch dashboard` in a subprocess, and the experiment-page screenshot (the tests'
and docs/dashboard.png's one code path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ggpo_batch.common.netutil import free_port
from tests.support.paths import REPO
from tests.support.waiting import wait_until


def cli_env(**values: str) -> dict[str, str]:
    """This process's environment without any GGPO_ setting, plus `values`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(values)
    return env


def ggpo(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`ggpo-batch ARGS` in a subprocess."""
    return subprocess.run([sys.executable, "-m", "ggpo_batch.cli", *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, check=False)


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(HTTP status, body) of a GET, errors included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Dashboard:
    """`ggpo-batch dashboard --port P` on 127.0.0.1 until stopped; its output in `log`. `program` is
    how ggpo-batch is started (default: this interpreter, the checkout's package)."""

    def __init__(self, env: dict[str, str], log: Path, *args: str,
                 program: tuple[str, ...] = (sys.executable, "-m", "ggpo_batch.cli"), cwd: Path = REPO,
                 prefix: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen([*prefix, *program, "dashboard", "--port", str(self.port), *args], env=env,
                                     cwd=cwd, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(self._answers, 60, f"the dashboard answering on {self.url}", interval=0.3)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"dashboard exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self._out.close()


def screenshot_experiment(page: Any, url: str, path: Path) -> Path:
    """The experiment page at `url`, its whole height at 1280 px wide, as a PNG at `path`."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector("table.runs")
    page.screenshot(path=str(path), full_page=True)
    return path
