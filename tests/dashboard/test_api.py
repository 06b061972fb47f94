"""/api/status is `ggpo-batch status --json` (the same calls, the same defaults), and
/api/components is `status --components --json`, read from a real server on a real ledger and Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.dashboard.server import Dashboard, get, ggpo
from tests.support.paths import SEED_000

pytestmark = [pytest.mark.redis]

SPEC = """
schema = 1
[experiment]
name = "queued-exp"
method = "ggpo"
seeds = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # 22 queued runs: more than the default page of 20
gpus = 4
loop_budget_seconds = 5
executor = "debug"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 2
templates = ["train_direct", "train_role"]
"""


@pytest.fixture(scope="module")
def server(module_cli: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A ledger with an imported experiment (15 succeeded runs), one with 22 runs queued in Redis,
    and a decision about an experiment never queued; the dashboard over it."""
    cli, tmp_path = module_cli, tmp_path_factory.mktemp("api")
    spec = tmp_path / "queued-exp.toml"
    spec.write_text(SPEC)
    for args in (["ledger", "import", str(SEED_000), "--name", "done-exp"], ["enqueue", str(spec)],
                 ["decide", "paper-full", "--not-reproduced", "--reason", "too costly", "--cost-basis",
                  "the paper's 64-GPU setup", "--estimated-gpu-hours", "5000"]):
        done = ggpo(cli, *args)
        assert done.returncode == 0, (args, done.stderr)
    dash = Dashboard(cli, tmp_path / "dashboard.log")
    yield dash
    dash.stop()


STATUS_ARGS = [
    [],
    ["--runs"],
    ["--runs", "--limit", "2"],
    ["-e", "queued-exp"],
    ["-s", "queued"],
    ["-s", "succeeded", "-s", "not_reproduced", "--limit", "4"],
]


def _query(args: list[str]) -> str:
    names = {"-e": "experiment", "-s": "state", "--limit": "limit"}
    pairs, i = [], 0
    while i < len(args):
        if args[i] == "--runs":
            pairs.append(("runs", "1"))
            i += 1
        else:
            pairs.append((names[args[i]], args[i + 1]))
            i += 2
    return urlencode(pairs)


@pytest.mark.parametrize("args", STATUS_ARGS, ids=lambda a: " ".join(a) or "default")
def test_api_status_is_status_json(server: Dashboard, module_cli: dict[str, str], args: list[str]) -> None:
    code, body = get(f"{server.url}/api/status?{_query(args)}")
    assert code == 200, body
    done = ggpo(module_cli, "status", "--json", *args)
    assert done.returncode == 0, done.stderr
    assert json.loads(body) == json.loads(done.stdout)
    data = json.loads(body)
    assert data["experiments"] or data["decided"]  # never an empty comparison
    if not args:  # the default view holds every kind of content compared: queue positions, decisions
        queued = next(e for e in data["experiments"] if e["experiment"] == "queued-exp")
        positions = [r["queue_position"] for r in queued["runs"]]
        assert len(positions) == 20 and queued["runs_not_shown"] == 2 and set(positions) <= set(range(1, 23))
        assert [d["experiment"] for d in data["decided"]] == ["paper-full"]


def test_api_components_is_status_components_json(server: Dashboard, module_cli: dict[str, str]) -> None:
    code, body = get(f"{server.url}/api/components")
    done = ggpo(module_cli, "status", "--components", "--json")
    assert code == 200 and done.returncode == 0, (body, done.stderr)
    assert json.loads(body) == json.loads(done.stdout)
    assert [m["method"] for m in json.loads(body)["components"]["methods"]] == ["ggpo"]


@pytest.mark.parametrize("query", ["by=user", "by=experiment", "by=queue", "by=month&since=2026-01-01"])
def test_api_costs_is_costs_json_and_the_costs_page_shows_the_same_table(server: Dashboard, module_cli: dict[str, str],
                                                                         query: str) -> None:
    """/api/costs is `ggpo-batch costs --json` with the same options, and /costs renders that table."""
    import html

    args = [a for pair in query.split("&") for a in (f"--{pair.split('=')[0]}", pair.split("=")[1])]
    code, body = get(f"{server.url}/api/costs?{query}")
    done = ggpo(module_cli, "costs", "--json", *args)
    assert code == 200 and done.returncode == 0, (body, done.stderr)
    assert json.loads(body) == json.loads(done.stdout)
    view = json.loads(body)
    assert view["rows"] and view["totals"]["gpu_hours"] == pytest.approx(57.2974, abs=1e-4)
    code, page = get(f"{server.url}/costs?{query}")
    assert code == 200, page
    text = html.unescape(page)
    for row in view["rows"]:
        assert f"<td>{row['key'] if row['key'] is not None else '-'}</td>" in text
    assert f"{view['totals']['decided_not_spent_gpu_hours']:,.3f}" in text  # 5,000.000: the decision


@pytest.mark.parametrize(("path", "code", "message"), [
    ("/api/costs?by=arm", 400, "by='arm': one of user, experiment, queue, month"),
    ("/api/costs?since=yesterday", 400, "since='yesterday': a day, YYYY-MM-DD"),
    ("/api/status?state=bogus", 400, "state='bogus': states are queued"),
    ("/api/status?limit=-1", 400, "limit='-1': must be a whole number >= 0"),
    ("/api/status?experiment=bad%20name", 400, "experiment:"),
    ("/api/experiments/no-such", 404, "no experiment 'no-such' in the ledger"),
    ("/api/experiments/done-exp?version=7", 404, "has no version 7"),
    ("/api/runs/no-such-run", 404, "no run 'no-such-run' in the ledger"),
])
def test_api_refuses_bad_input_with_one_line(server: Dashboard, path: str, code: int, message: str) -> None:
    got, body = get(server.url + path)
    assert got == code, body
    assert message in json.loads(body)["error"]


def test_api_experiment_and_run_carry_the_report_and_the_attempts(server: Dashboard) -> None:
    code, body = get(f"{server.url}/api/experiments/done-exp")
    assert code == 200
    data = json.loads(body)
    assert data["status"]["totals"]["states"] == {"succeeded": 15} and len(data["status"]["runs"]) == 15
    assert data["report"]["totals"]["spent_gpu_hours"] == pytest.approx(57.2974, abs=1e-4)
    code, body = get(f"{server.url}/api/runs/queued-exp-v1-1-clean")
    assert code == 200
    run = json.loads(body)
    assert run["run"]["state"] == "queued" and run["attempts"] == [] and run["queue"] == "dashq"
    assert [e["to_state"] for e in run["events"]] == ["queued"]


@pytest.mark.slow  # two requests, each waiting out the dashboard's 10 s ledger retry
def test_a_ledger_gone_bad_under_the_server_is_503_with_one_line(cli: dict[str, str], tmp_path: Path) -> None:
    import sqlite3

    dash = Dashboard(cli, tmp_path / "dashboard.log")
    try:
        assert get(dash.url + "/api/status")[0] == 200
        with sqlite3.connect(cli["GGPO_DB_URL"].removeprefix("sqlite:///")) as conn:
            for table in ("events", "attempts", "runs", "experiments"):  # a damaged ledger: reading it fails
                conn.execute(f"DROP TABLE {table}")
        code, body = get(dash.url + "/api/status")
        assert code == 503 and json.loads(body)["error"].startswith("the ledger database is unavailable: no such table")
        code, body = get(dash.url + "/")
        assert code == 503 and "the ledger database is unavailable" in body
    finally:
        dash.stop()
