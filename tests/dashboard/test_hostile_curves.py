"""A running run's curve file near the float limit (issue 42, class 9), end to end: a real dashboard
over a real ledger serves the experiment page, its curves fragment and the curves API without a 500,
the API body strict JSON (was: OverflowError and Infinity/NaN)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.contracts.curve import start_curve
from ggpo_batch.ledger import NewRun, connect
from tests.dashboard.server import Dashboard, get

HUGE = [1e308, -1e308, 1.7e308, -1.7e308, 1.79e308]


def test_a_live_curve_near_the_float_limit_is_served_finite(cli: dict[str, str], tmp_path: Path) -> None:
    led = connect(cli["GGPO_DB_URL"])
    keys = [f"huge-v1-{s}-clean" for s in (1, 2)]
    led.create_experiment(name="huge", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=1,
                          actor="t", runs=[NewRun(run_key=k, arm="clean", seed=s, config_hash="h",
                                                  run_spec={"gpus": 1}) for s, k in enumerate(keys, 1)])
    jobs = Path(cli["GGPO_DATA_DIR"]) / "jobs"
    for i, key in enumerate(keys):
        led.begin_attempt(key, executor="local", gpus=1, actor="t", worker="w")
        led.mark_submitted(key, 1, job_id=f"{900 + i}", actor="t")
        led.mark_running(key, 1, actor="t")
        start_curve(attempt_folder(jobs, key, 1), [
            {"step": n, "loop_seconds": float(n + 1), "loss": v, "mean_reward": -v, "kl": v / 3}
            for n, v in enumerate(HUGE[i:] + HUGE[:i])])
    led.engine.dispose()
    dash = Dashboard(cli, tmp_path / "dashboard.log")
    try:
        for route in ("/experiments/huge", "/fragments/experiments/huge/curves"):
            code, body = get(dash.url + route)
            assert code == 200, (route, body[-500:])
            assert 'data-source="live"' in body or route == "/experiments/huge", body[-2000:]
        code, body = get(dash.url + "/api/experiments/huge/curves")
        assert code == 200, body[-500:]
        doc = json.loads(body, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
        reward = doc["arms"]["clean"]["mean_reward"]
        assert reward["mean"] and len(reward["mean"]) == len(reward["low"]) == len(reward["high"])
        assert {r["source"] for r in doc["runs"]} == {"live"}
    finally:
        dash.stop()
