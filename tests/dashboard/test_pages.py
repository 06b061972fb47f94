"""Every page in a real headless Chromium: loads with no console error and shows the ledger; with a
token, every page and API route refuses a request without it (401) or with a wrong one (403)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dashboard.conftest import Browsed
from tests.dashboard.server import Dashboard, get, ggpo
from tests.support.paths import SEED_000

pytestmark = [pytest.mark.browser, pytest.mark.redis]

TOKEN = "dash-Token-0123456789abcdef"


@pytest.fixture(scope="module")
def ledger_env(module_cli: dict[str, str]) -> dict[str, str]:
    """An imported experiment (5 arms x 3 seeds, succeeded) and a decision about one never queued."""
    for args in (["ledger", "import", str(SEED_000), "--name", "seed000"],
                 ["decide", "paper-full", "--not-reproduced", "--reason", "too costly", "--cost-basis", "64 GPUs",
                  "--estimated-gpu-hours", "5000"]):
        done = ggpo(module_cli, *args)
        assert done.returncode == 0, (args, done.stderr)
    return module_cli


@pytest.fixture(scope="module")
def open_server(ledger_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    dash = Dashboard(ledger_env, tmp_path_factory.mktemp("open") / "dashboard.log")
    yield dash
    dash.stop()


@pytest.fixture(scope="module")
def token_server(ledger_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    dash = Dashboard({**ledger_env, "GGPO_DASHBOARD_TOKEN": TOKEN}, tmp_path_factory.mktemp("tok") / "dashboard.log")
    yield dash
    dash.stop()


def _visit(b: Browsed, url: str) -> str:
    response = b.page.goto(url)
    assert response is not None and response.status == 200, (url, response and response.status)
    b.page.wait_for_load_state("networkidle")
    return b.page.content()


@pytest.mark.slow  # about 12 s: every page, and a refresh cycle
def test_every_page_loads_without_console_errors_and_shows_the_ledger(open_server: Dashboard,
                                                                       browsed: Browsed) -> None:
    page = browsed.page
    _visit(browsed, open_server.url + "/")
    row = page.locator("tr[data-experiment=seed000]")
    assert row.locator("td").nth(2).inner_text().strip() == "15 succeeded"
    # spent (the report's total), estimated (none: imported), decided not spent (nothing decided about it)
    assert [row.locator("td").nth(i).inner_text() for i in (4, 5, 6)] == ["57.2974", "-", "0.000"]
    assert "paper-full" in page.locator("body").inner_text() and "5,000.00" in page.locator("body").inner_text()

    page.click("text=seed000 v1")
    page.wait_for_selector("table.runs")
    assert page.locator("table.runs tbody tr").count() == 15
    assert page.locator("table.runs td.state").all_inner_texts() == ["succeeded"] * 15
    assert page.locator("table.report caption").count() >= 2  # the report's tables, as `report` lays them out
    assert page.locator(".plots img").count() == 2  # GPU-hours and steps per arm (no outcomes in the import)
    assert all(page.locator(".plots img").nth(i).evaluate("i => i.naturalWidth > 0") for i in range(2))

    page.click("tr[data-run='seed000-v1-20261012-clean'] a")
    page.wait_for_selector("#run")
    text = page.locator("#run").inner_text()
    assert "attempt 1" in text and "imported from a results file: it has no job and no log" in text
    assert page.locator("table.events tbody tr").count() == 2

    _visit(browsed, open_server.url + "/nightly")
    assert page.locator("h2").all_inner_texts() == ["ggpo"]  # the suite's method, with its (missed) nights

    page.click("nav >> text=costs")  # by user: the importer (this ledger's OS user or GGPO_USER) and the decider
    page.wait_for_selector("table.costs")
    page.click("a[href='/costs?by=experiment']")  # regrouped by experiment, the table of `costs --by experiment`
    page.wait_for_url("**/costs?by=experiment")
    cells = [r.locator("td").all_inner_texts() for r in page.locator("table.costs tbody tr").all()]
    assert cells == [["paper-full", "0.000", "0", "5,000.000"], ["seed000", "57.297", "15", "0.000"]]
    page.wait_for_timeout(2500)  # a refresh cycle of the live parts: no error from the script either
    assert browsed.errors == []


@pytest.mark.parametrize("path", ["/", "/experiments/seed000", "/runs/seed000-v1-20261012-clean", "/nightly",
                                  "/costs", "/api/costs", "/api/status", "/api/components", "/api/runs/seed000-v1-20261012-clean",
                                  "/fragments/experiments/seed000/runs", "/static/dashboard.js"])
def test_the_token_is_enforced_on_every_route(token_server: Dashboard, path: str) -> None:
    assert get(token_server.url + path)[0] == 401
    assert get(token_server.url + path, {"Authorization": "Bearer wrong-token-0123456789"})[0] == 403
    assert get(token_server.url + path + "?token=wrong-token-0123456789")[0] == 403
    code, body = get(token_server.url + path, {"Authorization": f"Bearer {TOKEN}"})
    assert code == 200 and TOKEN not in body


@pytest.mark.slow  # about 8 s
def test_a_browser_opens_with_the_token_once_and_keeps_it_in_a_cookie(token_server: Dashboard, browsed: Browsed,
                                                                    chromium: object) -> None:
    page = browsed.page
    response = page.goto(token_server.url + "/")
    assert response is not None and response.status == 401
    browsed.errors.clear()  # the refused page's own "401" console line is expected here

    _visit(browsed, f"{token_server.url}/experiments/seed000?version=1&token={TOKEN}")
    assert page.url == f"{token_server.url}/experiments/seed000?version=1"  # the token left the address bar
    assert TOKEN not in page.content()
    [cookie] = page.context.cookies()
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
    page.wait_for_timeout(2500)  # the live table refreshes with the cookie
    assert page.locator("table.runs td.state").count() == 15
    _visit(browsed, token_server.url + "/nightly")
    assert browsed.errors == []


def test_a_screenshot_of_the_experiment_page_is_small(open_server: Dashboard, browsed: Browsed,
                                                      tmp_path: Path) -> None:
    from tests.dashboard.server import screenshot_experiment

    shot = screenshot_experiment(browsed.page, open_server.url + "/experiments/seed000", tmp_path / "experiment.png")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 300_000, len(data)
    assert browsed.errors == []


def test_a_loopback_dashboard_answers_only_to_loopback_host_names(open_server: Dashboard) -> None:
    # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1 must read nothing.
    assert get(open_server.url + "/api/status", {"Host": f"evil.example:{open_server.port}"})[0] == 400
    for host in ("127.0.0.1", "localhost"):
        assert get(open_server.url + "/api/status", {"Host": f"{host}:{open_server.port}"})[0] == 200
