"""Sequential waves end to end on a real CPU experiment: `ggpo-batch worker --burst` runs the first
wave (2 seeds x 2 arms, 1-second loops on the tiny model, debug executor), reconcile takes look 1
and records it, and the second wave is released (and run, and its look recorded) or its runs
cancelled, whichever the look decided."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.spec.parse import load_spec
from tests.support.workers import run_burst_worker

pytestmark = [pytest.mark.redis, pytest.mark.train, pytest.mark.slow]

SPEC = """
schema = 1
[experiment]
name = "waves"
method = "ggpo"
seeds = [1, 2, 3]
gpus = 1
loop_budget_seconds = 1
executor = "debug"
[train]
eval_size = 4
[arms.clean]
exposure = "none"
[arms.hot.train]
lr = 3e-3
[power]
metric = "steps"
design = "sequential"
waves = [2, 3]
"""


@pytest.mark.slow_reason("six real 1-second CPU runs in two waves through an RQ worker, with a look between")
def test_a_worker_runs_the_first_wave_and_reconcile_looks_then_releases_or_cancels_the_second(  # type: ignore[no-untyped-def]
        ledger, settings, worker_env, tmp_path: Path, db_url: str) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("the path is backend-neutral; the looks are tested on both backends in tests/test_waves.py")
    spec = tmp_path / "waves.toml"
    spec.write_text(SPEC)
    res = enqueue_spec(ledger, settings, load_spec(spec), actor="tester")
    assert sorted(res.held) == ["waves-v1-3-clean", "waves-v1-3-hot"] and res.enqueued == 4
    done = run_burst_worker(["--queue", "testq", "--reconcile-interval", "5"], dict(os.environ), timeout=400)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    exp = ledger.latest_experiment("waves")
    looks = ledger.looks(exp.id)
    wave1 = {f"{seed}-{a}": ledger.get_run(f"waves-v1-{seed}-{a}") for seed in (1, 2) for a in ("clean", "hot")}
    assert {r.state for r in wave1.values()} == {"succeeded"}, {k: (r.state, r.cause) for k, r in wave1.items()}
    first = looks[0]
    assert (first["arm"], first["look"], first["looks"], first["seeds"], first["metric"]) == ("hot", 1, 2, 2, "steps")
    assert first["seeds_paired"] == 2 and set(first["per_seed"]) == {"1", "2"}, looks
    assert first["decision"] in ("continue", "crossed", "futile"), first
    second = {a: ledger.get_run(f"waves-v1-3-{a}") for a in ("clean", "hot")}
    if first["decision"] == "continue":  # released: the worker ran the second wave, and its look was taken
        assert {r.state for r in second.values()} == {"succeeded"}, {k: r.cause for k, r in second.items()}
        assert [(lk["look"], lk["decision"]) for lk in looks[1:]] in ([(2, "final")], [(2, "crossed")])
        assert looks[1]["seeds_paired"] == 3
    else:  # the arm stopped: its runs of the second wave, and the baseline's, cancelled with the look's reason
        assert {r.state for r in second.values()} == {"cancelled"} and len(looks) == 1
        assert first["decision"] in second["hot"].cause
    events = [e for e in ledger.events(run_key="waves-v1-3-hot") if e.from_state == "held"]
    assert len(events) == 1 and events[0].actor.startswith("tester")
