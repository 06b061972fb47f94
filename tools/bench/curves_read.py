"""What reading the learning curves of a 1,000-run experiment costs, as `report --plot` and the
dashboard read them (reporting/learning_curves.py: the ledger's `curve_points`, booked by settlement),
against a baseline measured in the same run: opening every run's details file and taking its history.
Also what settlement's bulk insert of one run's curve costs.

Each run has `--steps` points of every figure (curve.FIGURES); its details file holds the same
history plus an evaluation of `--items` per-item rows (a real details file also holds the audit), so
the baseline reads what a report would have to read without the ledger.

    PYTHONPATH=. .venv/bin/python tools/bench/curves_read.py [--runs 1000] [--steps 200] [--db sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from ggpo_batch.contracts.allocation import attempt_folder, details_path
from ggpo_batch.contracts.curve import FIGURES, points_of
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.ledger.observations import Observations
from ggpo_batch.reporting.learning_curves import arm_curves, run_curves

METRICS = ("mean_reward", "kl")


def history(rng: random.Random, steps: int) -> list[dict]:
    return [{"step": i, "loss": rng.random(), "gradient_norm": rng.random(), "retained_groups": 8,
             "rejected_groups": 0, "raw_gap": rng.random(), "mean_length": 100 * rng.random(),
             "reference_refreshed": False, "branch": "deepspeed_zero2", "loop_seconds": 13.5 * (i + 1),
             "weight_sync_seconds": rng.random(), "mean_reward": rng.random(), "kl": rng.random() / 100,
             "clip_fraction": rng.random() / 10, "tokens_per_second": 5000 * rng.random(),
             "logprob_gap_mean": rng.random() / 100, "logprob_gap_p99": rng.random() / 10,
             "is_weight_mean": None, "weight_sync_probe": {"gap": rng.random() / 100, "passed": True}}
            for i in range(steps)]


def build(root: Path, url: str, runs: int, steps: int, items: int) -> tuple:  # type: ignore[type-arg]
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    led = connect(url)
    keys = [f"curves-v1-{i}-{('clean', 'paired', 'random')[i % 3]}" for i in range(runs)]
    exp = led.create_experiment(name="curves", version=1, method="ggpo", source="spec", spec_hash="h", spec={},
                                gpus=4, actor="b", runs=[NewRun(run_key=k, arm=k.rsplit("-", 1)[1], seed=i,
                                                                config_hash="c", run_spec={})
                                                         for i, k in enumerate(keys)])
    rng = random.Random(7)
    inserts = []
    for k in keys:
        h = history(rng, steps)
        folder = attempt_folder(root / "jobs", k, 1)
        folder.mkdir(parents=True)
        evaluation = {"items": [{"item_id": f"i{j}", "rewards": [rng.random()], "answers": ["x" * 40]}
                                for j in range(items)]}
        details_path(folder).write_text(json.dumps({"run_key": k, "history": h, "evaluation": evaluation}))
        led.begin_attempt(k, executor="local", gpus=4, actor="b", worker="b")
        led.mark_submitted(k, 1, job_id=f"j-{k}", actor="b")
        t = time.perf_counter()
        led.mark_finished(k, 1, attempt_state="succeeded", run_state="succeeded", actor="b",
                          result={"training": {"status": "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED"}},
                          observations=Observations(None, None, points_of(h)))
        inserts.append(time.perf_counter() - t)
    return led, exp, keys, inserts


def from_details(root: Path, keys: list[str]) -> dict[str, list[dict]]:
    """The baseline: every details file opened, its history taken."""
    out = {}
    for k in keys:
        out[k] = points_of(json.loads(details_path(attempt_folder(root / "jobs", k, 1)).read_text())["history"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--items", type=int, default=500, help="per-item evaluation rows in each details file")
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.db == "sqlite":
            url = f"sqlite:///{root / 'ledger.sqlite3'}"
        else:
            from tests.support.services import PG_ADMIN_URL, wipe_pg

            url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/ggpo_bench_curves"
            import psycopg

            with psycopg.connect(PG_ADMIN_URL.replace("+psycopg", ""), autocommit=True) as conn:
                conn.execute("DROP DATABASE IF EXISTS ggpo_bench_curves WITH (FORCE)")
                conn.execute("CREATE DATABASE ggpo_bench_curves")
            wipe_pg(url)
        t = time.perf_counter()
        led, exp, keys, inserts = build(root, url, args.runs, args.steps, args.items)
        print(f"built {args.runs} runs x {args.steps} steps in {time.perf_counter() - t:.1f} s; settlement with the "
              f"curve's bulk insert: median {statistics.median(inserts) * 1000:.1f} ms a run")
        size = sum(details_path(attempt_folder(root / "jobs", k, 1)).stat().st_size for k in keys)
        print(f"details files: {size / 2**20:.0f} MiB in all")
        runs = led.runs(experiment_id=exp.id)
        ledger_s, files_s, drawn_s = [], [], []
        for _ in range(args.rounds):
            t = time.perf_counter()
            cols = led.curves(exp.id, ("loop_seconds", *METRICS))
            ledger_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            files = from_details(root, keys)
            files_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            arm_curves(run_curves(led, exp.id, runs, metrics=METRICS), METRICS)
            drawn_s.append(time.perf_counter() - t)
        first = runs[0]
        assert cols[first.id]["mean_reward"] == [p["mean_reward"] for p in files[first.run_key]]
        assert len(cols) == args.runs and set(FIGURES) >= set(METRICS)
        lm, fm = statistics.median(ledger_s), statistics.median(files_s)
        print(f"read {args.runs} curves ({args.db}, median of {args.rounds}): ledger {lm:.3f} s, every details file "
              f"{fm:.3f} s; ratio ledger/details {lm / fm:.3f}")
        print(f"the report's whole read (runs -> ledger curves -> per-arm mean and band): "
              f"{statistics.median(drawn_s):.3f} s")
        led.engine.dispose()


if __name__ == "__main__":
    main()
