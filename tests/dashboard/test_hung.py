"""A running run whose job went silent is flagged hung on the pages, as `status` flags it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.dashboard.conftest import Browsed
from tests.dashboard.server import Dashboard, ggpo

pytestmark = [pytest.mark.browser, pytest.mark.redis, pytest.mark.slow]  # an enqueue (preflight): 5 s and more

SPEC = """
schema = 1
[experiment]
name = "silent"
method = "ggpo"
seeds = [1, 2]
gpus = 4
loop_budget_seconds = 60
executor = "local"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


@pytest.fixture
def silent(cli: dict[str, str], tmp_path: Path) -> Iterator[Dashboard]:
    """Two runs: seed 1 running since 20 minutes without a heartbeat, seed 2 still queued."""
    from ggpo_batch.ledger import connect

    spec = tmp_path / "silent.toml"
    spec.write_text(SPEC)
    done = ggpo(cli, "enqueue", str(spec))
    assert done.returncode == 0, done.stderr
    led = connect(cli["GGPO_DB_URL"])
    led.begin_attempt("silent-v1-1-clean", executor="local", gpus=4, actor="tester", worker="w1")
    led.mark_submitted("silent-v1-1-clean", 1, job_id="777", actor="tester")
    led.mark_running("silent-v1-1-clean", 1, actor="tester", started_at=datetime.now(UTC) - timedelta(minutes=20))
    led.engine.dispose()
    dash = Dashboard({**cli, "GGPO_HUNG_AFTER_SECONDS": "600"}, tmp_path / "dashboard.log")
    yield dash
    dash.stop()


def test_a_silent_running_run_is_flagged_hung_on_the_index_and_the_experiment_page(silent: Dashboard,
                                                                                  browsed: Browsed) -> None:
    page = browsed.page
    page.goto(silent.url + "/")
    assert "1 hung" in page.locator("tr[data-experiment=silent] td.states").inner_text()
    page.goto(silent.url + "/experiments/silent")
    row = page.locator("tr[data-run='silent-v1-1-clean']")
    assert row.get_attribute("class") == "hung"
    assert row.locator("td.state").inner_text() == "running, no heartbeat 20 min after start"
    other = page.locator("tr[data-run='silent-v1-2-clean']")
    assert other.get_attribute("class") is None and other.locator("td.state").inner_text() == "queued"
    assert browsed.errors == []
