"""A run's state changes on the experiment page, without a reload, while a real `ggpo-batch worker
--burst` runs it with the local executor; the run page then shows its attempt and its job's log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import Browsed
from tests.dashboard.server import Dashboard, ggpo, screenshot_experiment
from tests.support.paths import REPO

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "live-demo"
method = "ggpo"
seeds = [1]
gpus = 1
loop_budget_seconds = 4
executor = "local"
max_gpu_hours = 1.0
[overheads]
setup_export_seconds = 20
audit_seconds = 2
evaluation_seconds = 5
[train]
eval_size = 4
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 2
templates = ["train_direct", "train_role"]
"""
KEYS = ("live-demo-v1-1-clean", "live-demo-v1-1-paired")
FINAL = {"succeeded", "failed", "timeout", "cancelled", "lost"}


@pytest.fixture
def queued(cli: dict[str, str], tmp_path: Path) -> Iterator[Dashboard]:
    spec = tmp_path / "live-demo.toml"
    spec.write_text(SPEC)
    done = ggpo(cli, "enqueue", str(spec), timeout=300)
    assert done.returncode == 0, done.stderr
    dash = Dashboard(cli, tmp_path / "dashboard.log")
    yield dash
    dash.stop()


def _states(page) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {key: page.locator(f"tr[data-run='{key}']").get_attribute("data-state") or "" for key in KEYS}


def test_the_page_follows_a_real_worker_without_a_reload(queued: Dashboard, cli: dict[str, str],
                                                         browsed: Browsed, tmp_path: Path) -> None:
    page = browsed.page
    page.goto(queued.url + "/experiments/live-demo")
    assert _states(page) == {k: "queued" for k in KEYS}
    page.evaluate("window.__sameDocument = true")  # gone if the page were ever reloaded
    worker_log = tmp_path / "worker.log"
    with worker_log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "worker", "--queue", "dashq", "--burst",
                                   "--reconcile-interval", "5"], env=cli, cwd=REPO, stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        seen: list[dict[str, str]] = []
        try:
            end = time.monotonic() + 400
            while time.monotonic() < end:
                now = _states(page)
                if not seen or now != seen[-1]:
                    seen.append(now)
                if all(s in FINAL for s in now.values()):
                    break
                assert worker.poll() is None or worker.returncode == 0, worker_log.read_text()[-3000:]
                time.sleep(0.5)
            else:
                raise AssertionError(f"runs not ended after 400 s; states seen: {seen}\n{worker_log.read_text()[-3000:]}")
            assert worker.wait(timeout=120) == 0, worker_log.read_text()[-3000:]
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
    assert seen[-1] == {k: "succeeded" for k in KEYS}, (seen, worker_log.read_text()[-3000:])
    between = {s for states in seen[1:-1] for s in states.values()}
    assert between & {"submitting", "submitted", "running"}, seen  # the page showed the runs under way
    assert page.evaluate("window.__sameDocument") is True
    # the jobs' last heartbeats, which reconcile copied into the ledger
    assert all(page.locator(f"tr[data-run='{k}'] td.heartbeat").inner_text().startswith("step ") for k in KEYS)
    page.wait_for_timeout(2500)  # the totals line follows too
    assert "2 succeeded" in page.locator("p.totals").inner_text()
    screenshot_experiment(page, queued.url + "/experiments/live-demo", tmp_path / "experiment.png")
    if os.environ.get("GGPO_DASHBOARD_SCREENSHOT"):  # docs/dashboard.png is made by this same code path
        screenshot_experiment(page, queued.url + "/experiments/live-demo", Path(os.environ["GGPO_DASHBOARD_SCREENSHOT"]))
    # A picture small enough for the docs. Its size follows what the page draws: the learning curves
    # have as many points as the runs had steps, more on a quiet machine (302 KB seen at 4 s budgets).
    assert (tmp_path / "experiment.png").stat().st_size < 450_000

    page.click(f"tr[data-run='{KEYS[0]}'] a")
    page.wait_for_selector("details.log")
    assert page.locator("section.attempt").count() == 1
    assert page.locator("section.attempt h3 .state").inner_text() == "succeeded"
    assert page.locator("details.log[data-rank='0'][data-stream='stdout'] pre").inner_text().strip()
    assert browsed.errors == []
