"""Learning curves of a real 2-run CPU experiment, run by `ggpo-batch worker --burst` with the local
executor: the experiment page's curves grow while a run trains (its job's curve file, read as it is
written), then come from the ledger; what the ledger booked equals each run's details history; `report
--plot` draws them; the report of this fair experiment has no provenance warning; the run page and
`status --runs --json` show each run's provenance. With GGPO_CURVES_SCREENSHOT=PATH the page's
curves are saved there, and with GGPO_CURVES_PLOT=PATH the report's PNG (docs/ is made by this code)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder, details_path
from ggpo_batch.contracts.curve import FIGURES, points_of
from ggpo_batch.contracts.provenance import read_provenance, split_distributions
from ggpo_batch.ledger import connect
from tests.dashboard.conftest import Browsed
from tests.dashboard.server import Dashboard, get, ggpo
from tests.support.paths import REPO
from tests.support.provenance import head
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "curves-demo"
method = "ggpo"
seeds = [1]
gpus = 1
loop_budget_seconds = 24
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
KEYS = ("curves-demo-v1-1-clean", "curves-demo-v1-1-paired")
FINAL = {"succeeded", "failed", "timeout", "cancelled", "lost"}
_ROW = re.compile(r'data-curve-run="([^"]+)" data-points="(\d+)" data-source="(\w+)"')


def _fragment_rows(dash: Dashboard) -> dict[str, tuple[int, str]]:
    """run key -> (points, source) as the curves fragment lists them now."""
    code, body = get(dash.url + "/fragments/experiments/curves-demo/curves")
    assert code == 200, body
    return {k: (int(n), src) for k, n, src in _ROW.findall(body)}


def test_the_curves_of_a_real_experiment_grow_while_it_trains_and_match_its_history(
        cli: dict[str, str], browsed: Browsed, tmp_path: Path) -> None:
    spec = tmp_path / "curves-demo.toml"
    spec.write_text(SPEC)
    done = ggpo(cli, "enqueue", str(spec), timeout=300)
    assert done.returncode == 0, done.stderr
    dash = Dashboard(cli, tmp_path / "dashboard.log")
    page = browsed.page
    try:
        page.goto(dash.url + "/experiments/curves-demo")
        assert page.locator("#curves .no-curves").count() == 1
        page.evaluate("window.__sameDocument = true")
        seen: dict[str, list[int]] = {k: [] for k in KEYS}  # points listed while the run trained
        page_saw_live = False
        worker_log = tmp_path / "worker.log"
        with worker_log.open("wb") as out:
            worker = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "worker", "--queue", "dashq", "--burst",
                                       "--reconcile-interval", "5"], env=cli, cwd=REPO, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            try:
                end = time.monotonic() + 500
                while worker.poll() is None and time.monotonic() < end:
                    for key, (points, source) in _fragment_rows(dash).items():
                        if source == "live" and (not seen[key] or seen[key][-1] != points):
                            seen[key].append(points)
                    page_saw_live = page_saw_live or page.locator("#curves tr[data-source='live']").count() > 0
                    time.sleep(0.5)
                assert worker.wait(timeout=60) == 0, worker_log.read_text()[-3000:]
            finally:
                if worker.poll() is None:
                    os.killpg(worker.pid, signal.SIGKILL)
                    worker.wait()
        # The live curve grew while each run trained, and the page itself showed it, without a reload.
        assert all(len(s) >= 2 and s == sorted(s) for s in seen.values()), seen
        assert page_saw_live and page.evaluate("window.__sameDocument") is True

        led = connect(cli["GGPO_DB_URL"])
        [exp] = led.experiments("curves-demo")
        runs = {r.run_key: r for r in led.runs(experiment_id=exp.id)}
        assert {k: r.state for k, r in runs.items()} == {k: "succeeded" for k in KEYS}
        curves = led.curves(exp.id)
        jobs = Path(cli["GGPO_DATA_DIR"]) / "jobs"
        for key in KEYS:
            folder = attempt_folder(jobs, key, 1)
            details = json.loads(details_path(folder).read_text())
            history = points_of(details["history"])
            assert len(history) == len(details["history"]) >= 3  # a curve, on a loaded machine too
            booked = curves[runs[key].id]
            # Read back from the ledger, the curve is the details' history, figure for figure.
            assert booked["step"] == [p["step"] for p in history]
            assert {f: booked[f] for f in FIGURES} == {f: [p[f] for p in history] for f in FIGURES}
            assert all(v is not None for v in booked["mean_reward"] + booked["tokens_per_second"] + booked["loss"])
            # The provenance booked is the job's, and is this checkout's code.
            attempt_id, prov = led.latest_provenance([runs[key].id])[runs[key].id]
            assert attempt_id == runs[key].attempts[-1].id
            assert split_distributions(read_provenance(folder) or {})[0] == prov
            assert prov["code"]["commit"] == head(REPO) and prov["environment"]["python"]
            assert details["provenance"]["environment"]["distributions"]
        led.engine.dispose()

        # Once booked, the page's curves come from the ledger, every step of each run.
        wait_until(lambda: page.locator("#curves tr[data-source='ledger']").count() == 2, 30,
                   "the page's curves read from the ledger", interval=0.5)
        for key in KEYS:
            row = page.locator(f"#curves tr[data-curve-run='{key}']")
            assert int(row.get_attribute("data-points") or 0) == len(curves[runs[key].id]["step"])
        for arm in ("clean", "paired"):
            assert int(page.locator(f"figure[data-metric='mean_reward'] g[data-arm='{arm}']")
                       .get_attribute("data-points") or 0) > 10
        kl_known = any(v is not None for c in curves.values() for v in c["kl"])
        kl_panel = page.locator("figure[data-metric='kl']")
        assert (kl_panel.locator("g.arm").count() == 2) if kl_known else "not recorded" in kl_panel.inner_text()
        if os.environ.get("GGPO_CURVES_SCREENSHOT"):  # docs/researcher.md's picture, from this page
            page.set_viewport_size({"width": 1280, "height": 900})
            page.locator("#curves").screenshot(path=os.environ["GGPO_CURVES_SCREENSHOT"])

        # The run page shows its attempt's provenance.
        page.goto(dash.url + f"/runs/{KEYS[0]}")
        page.click("details.provenance summary")
        assert page.locator("[data-field='code.commit'] code").inner_text() == head(REPO)
        assert page.locator("[data-field='hardware.cpu']").count() == 1
        assert browsed.errors == []
    finally:
        dash.stop()

    # status --runs --json: each run with its provenance.
    status = json.loads(ggpo(cli, "status", "--runs", "--json", "-e", "curves-demo").stdout)
    assert all(r["provenance"]["code"]["commit"] == head(REPO) for r in status["experiments"][0]["runs"])
    # The report of this fair experiment: no provenance warning; its curves drawn by --plot.
    rep = json.loads(ggpo(cli, "report", "curves-demo", "--json", "--plot", str(tmp_path / "plots")).stdout)
    kinds = {w["kind"] for w in rep["warnings"]}
    assert not kinds & {"code_differs", "environment_differs", "hardware_differs"}, rep["warnings"]
    assert not [n for n in rep["notes"] if "provenance" in n]
    png = tmp_path / "plots" / "learning_curves.png"
    assert str(png) in rep["plots"] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    if os.environ.get("GGPO_CURVES_PLOT"):
        shutil.copyfile(png, os.environ["GGPO_CURVES_PLOT"])
