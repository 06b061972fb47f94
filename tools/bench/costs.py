"""Benchmark: `ggpo-batch costs` at 100,000 runs against 1,000, on SQLite and PostgreSQL.

For each backend and size it builds a ledger of N runs in 10 experiments of 10 users on 2 queues,
each run with one booked attempt (GPU-hours by the scheduler, ended on a day of the last 12 months)
and one run in 20 decided not reproduced, then times, in a fresh process each (median of `--repeat`):

    costs --by user                   every attempt grouped by who is charged
    costs --by month                  every attempt grouped by the month it was booked
    costs --by user --since <30 days> the attempts booked since then (through ix_attempts_booked_at)

and the query alone in this process (`cost_view`, median of 5), and prints each with the ratio
100k / 1k, then the query plan of the `--since` query at the largest size (the index it reads).
The ledger is filled in bulk (COPY / executemany), not through enqueue: the figure is the reading.

    .venv/bin/python tools/bench/costs.py [--sizes 1000,100000] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_plane import (  # the same fresh-process timing and databases
    backend_url,
    run_cli,
)

USERS, EXPERIMENTS = 10, 10
SINCE_DAYS = 30


def fill(db_url: str, n: int) -> None:
    """N runs with one booked attempt each; one run in 20 decided not reproduced."""
    from sqlalchemy import text

    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.bulk import insert_rows
    from ggpo_batch.ledger.db import make_engine
    from ggpo_batch.ledger.schema import Attempt, Run

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    per = n // EXPERIMENTS
    for e in range(EXPERIMENTS):
        runs = [NewRun(run_key=f"c{e}-v1-{i}-a", arm="a", seed=i, config_hash="c", run_spec={},
                       estimated_gpu_hours=0.8) for i in range(per)]
        led.create_experiment(name=f"c{e}", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                              actor=f"user{e % USERS}", queue=f"q{e % 2}", runs=runs, initial_state="succeeded")
    now = datetime.now(UTC)
    with led.session() as s:
        ids = [i for (i,) in s.execute(text("SELECT id FROM runs ORDER BY id"))]
        cols = ("run_id", "number", "executor", "state", "submitted_by", "gpus", "created_at", "ended_at",
                "elapsed_seconds", "gpu_hours_job", "gpu_hours_scheduler")
        rows = []
        for k, run_id in enumerate(ids):
            ended = now - timedelta(days=k % 365, seconds=k % 86400)
            rows.append((run_id, 1, "slurm", "succeeded", "worker", 4, ended - timedelta(seconds=900), ended, 900.0,
                         1.0, 1.0))
        insert_rows(s, Attempt.__table__, cols, rows)
        s.execute(Run.__table__.update().where(Run.__table__.c.id % 20 == 0).values(state="not_reproduced"))
    if led.engine.dialect.name == "postgresql":
        with led.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    led.engine.dispose()


def query_seconds(db_url: str, by: str, since: datetime | None, repeat: int = 5) -> float:
    from ggpo_batch.ledger import connect
    from ggpo_batch.reporting.spending import cost_view

    led = connect(db_url)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        cost_view(led, by=by, since=since.date() if since else None, default_queue="ggpo")
        times.append(time.perf_counter() - t0)
    led.engine.dispose()
    return statistics.median(times)


def plan(db_url: str, since: datetime) -> str:
    """The database's plan of the `--since` query: which index it reads the attempts through."""
    from sqlalchemy import event

    from ggpo_batch.ledger import connect
    from ggpo_batch.reporting.spending import cost_view

    led = connect(db_url)
    captured: list[tuple[str, object]] = []
    event.listen(led.engine, "before_cursor_execute",
                 lambda _c, _cur, statement, params, *_: captured.append((statement, params)))
    cost_view(led, by="user", since=since.date(), default_queue="ggpo")
    statement, params = next((s, p) for s, p in captured if s.lstrip().upper().startswith("SELECT"))
    explain = "EXPLAIN QUERY PLAN " if led.engine.dialect.name == "sqlite" else "EXPLAIN "
    with led.engine.connect() as conn:
        cursor = conn.connection.dbapi_connection.cursor()
        cursor.execute(explain + statement, params)
        lines = [" ".join(str(c) for c in row) for row in cursor.fetchall()]
    led.engine.dispose()
    return "\n".join(f"    {line}" for line in lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,100000")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    since = datetime.now(UTC) - timedelta(days=SINCE_DAYS)
    commands = {"costs --by user": ["costs", "--by", "user"], "costs --by month": ["costs", "--by", "month"],
                f"costs --since -{SINCE_DAYS}d": ["costs", "--by", "user", "--since", since.date().isoformat()]}
    queries = {"costs --by user": ("user", None), "costs --by month": ("month", None),
               f"costs --since -{SINCE_DAYS}d": ("user", since)}
    results: dict[tuple[str, str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
        for backend in args.backends.split(","):
            for n in sizes:
                url, drop = backend_url(backend, workdir, f"costs{backend}{n}")
                try:
                    t0 = time.perf_counter()
                    fill(url, n)
                    print(f"[{backend} {n:>7,} runs] built in {time.perf_counter() - t0:.1f} s", flush=True)
                    env = {**base, "GGPO_DB_URL": url, "GGPO_DATA_DIR": str(workdir / "data"),
                           "GGPO_REDIS_URL": "redis://127.0.0.1:1/0"}  # costs never asks Redis
                    for name, cli_args in commands.items():
                        cli = statistics.median(run_cli(cli_args, env)[0] for _ in range(args.repeat))
                        query = query_seconds(url, *queries[name])
                        results[(backend, name, n)] = (cli, query)
                        print(f"  {name:<22} command {cli:6.3f} s   query {query * 1000:8.1f} ms", flush=True)
                    if n == sizes[-1]:
                        print(f"  plan of the --since query:\n{plan(url, since)}", flush=True)
                finally:
                    drop()
    lo, hi = sizes[0], sizes[-1]
    print(f"\nratio {hi:,} / {lo:,} runs: the command (fresh process), and the query alone")
    for backend in args.backends.split(","):
        for name in commands:
            (c_lo, q_lo), (c_hi, q_hi) = results[(backend, name, lo)], results[(backend, name, hi)]
            print(f"  {backend:<10} {name:<22} command {c_hi / c_lo:5.2f}x ({c_lo:.3f} -> {c_hi:.3f} s)   "
                  f"query {q_hi / q_lo:6.1f}x ({q_lo * 1000:.1f} -> {q_hi * 1000:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
