"""Benchmark: `ggpo-batch plan` on a ledger of 1,000 experiments, against `status` in the same run.

It builds a ledger of N experiments of the method (2 arms x 3 seeds each, every run succeeded with a
result record holding its steps: what `plan --metric steps` pools sigma from), then times, in a fresh
process each (median of `--repeat`):

    status                                  every experiment's per-arm totals (the baseline)
    plan SPEC --metric steps --effect 5     sigma pooled from the ledger (the newest 50 experiments of
                                            the method, reporting/variance.HISTORY_EXPERIMENTS)
    plan SPEC --metric steps --effect 5 --sigma 3.7   no history read: the statistics and the cost guard

and prints each with its ratio to `status`. The ledger is filled in bulk, not through enqueue.

    .venv/bin/python tools/bench/plan_1000.py [--experiments 1000] [--backends sqlite,postgresql] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_plane import (  # the same fresh-process timing and databases
    backend_url,
    run_cli,
)

SEEDS = (1, 2, 3)
ARMS = ("clean", "paired")
SPEC = """
schema = 1
[experiment]
name = "planned"
method = "ggpo"
seeds = [1, 2, 3]
gpus = 4
loop_budget_seconds = 2700
executor = "debug"
max_gpu_hours = 64.0
[arms.clean]
[arms.paired]
exposure = "paired"
exposed_items = 3
templates = ["train_direct", "train_role"]
"""


def fill(db_url: str, n: int) -> None:
    """N experiments of 2 arms x 3 seeds, every run succeeded with steps in its result record."""
    from sqlalchemy import text

    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.db import make_engine
    from ggpo_batch.ledger.schema import Run

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    rng = random.Random(20261012)
    for e in range(n):
        runs = [NewRun(run_key=f"x{e}-v1-{s}-{a}", arm=a, seed=s, config_hash="c", run_spec={"gpus": 4},
                       estimated_gpu_hours=3.8) for a in ARMS for s in SEEDS]
        led.create_experiment(name=f"x{e}", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                              actor="bench", runs=runs, initial_state="succeeded")
    with led.session() as s:
        ids = [(i, arm) for i, arm in s.execute(text("SELECT id, arm FROM runs ORDER BY id"))]
        table = Run.__table__
        from sqlalchemy import bindparam

        s.execute(table.update().where(table.c.id == bindparam("rid")).values(result=bindparam("res")),
                  [{"rid": i, "res": {"arm": arm, "training": {"counts": {"steps": 100 + round(rng.gauss(0, 3))}}}}
                   for i, arm in ids])
    if led.engine.dialect.name == "postgresql":
        with led.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    led.engine.dispose()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experiments", type=int, default=1000)
    ap.add_argument("--backends", default="sqlite")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = work / "planned.toml"
        spec.write_text(SPEC)
        for backend in args.backends.split(","):
            url, drop = backend_url(backend, work, "plan")
            try:
                fill(url, args.experiments)
                env = {**{k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}, "GGPO_DB_URL": url,
                       "GGPO_DATA_DIR": str(work / "data"), "GGPO_USER": "bench"}
                cases = {"status": ["status"],
                         "plan (sigma from the ledger)": ["plan", str(spec), "--metric", "steps", "--effect", "5"],
                         "plan --sigma 3.7": ["plan", str(spec), "--metric", "steps", "--effect", "5", "--sigma", "3.7"]}
                times = {name: statistics.median(run_cli(argv, env)[0] for _ in range(args.repeat))
                         for name, argv in cases.items()}
                base = times["status"]
                print(f"{backend}, {args.experiments:,} experiments ({args.experiments * 6:,} runs), median of "
                      f"{args.repeat} fresh processes:")
                for name, t in times.items():
                    print(f"  {name:<30} {t:7.2f} s   x{t / base:.2f} of status")
            finally:
                drop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
