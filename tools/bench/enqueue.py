"""Benchmark: enqueue of N runs (spec -> ledger -> RQ on the real Redis) against raw RQ.

Prints runs/s for `ggpo_batch.control.enqueue.enqueue_spec` and for raw RQ `enqueue_many` of trivial jobs
in chunks of 500 (the fastest raw path measured in FACTS.md), both in this run, and their ratio.
With --rounds N the two alternate N times (raw, ours, raw, ours, ...), each round's ratio is
printed, and the verdict is on the median ratio: on a shared machine a load that changes during
the run then moves both sides of a round, not one. Goal (issue 14): ratio >= 0.7 on both backends.

    .venv/bin/python tools/bench/enqueue.py [--runs 10000] [--db sqlite|postgresql] [--redis-db 14] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import redis
from rq import Queue
from rq.serializers import JSONSerializer

ARMS = 10


def _spec_text(n_runs: int) -> str:
    seeds = ", ".join(str(s) for s in range(n_runs // ARMS))
    arms = "\n".join(f'[arms.a{i}]\nexposure = "none"' for i in range(ARMS))
    return f"""schema = 1
[experiment]
name = "bench-{uuid.uuid4().hex[:8]}"
method = "ggpo"
seeds = [{seeds}]
gpus = 4
loop_budget_seconds = 60
executor = "local"
{arms}
"""


def raw_rq(conn: redis.Redis, n: int) -> float:
    q = Queue("bench-raw", connection=conn, serializer=JSONSerializer)
    q.enqueue_many([Queue.prepare_data("builtins.len", args=("x",), job_id=f"raw-warm-{j}") for j in range(ARMS)])
    t0 = time.perf_counter()
    for i in range(0, n, 500):
        with conn.pipeline() as pipe:
            q.enqueue_many([Queue.prepare_data("builtins.len", args=("x",), job_id=f"raw-{j}")
                            for j in range(i, min(n, i + 500))], pipeline=pipe)
            pipe.execute()
    return n / (time.perf_counter() - t0)


def writer_only(conn: redis.Redis, redis_url: str, n: int) -> float:
    """Jobs/s of our RQ chunk writer alone (no spec, no ledger), for the same job count."""
    from ggpo_batch.control.queue import RunQueue

    q = RunQueue.from_url(redis_url, "bench-writer")
    q.enqueue([f"writer-warm-{j}" for j in range(ARMS)])
    t0 = time.perf_counter()
    q.enqueue([f"writer-{j}" for j in range(n)])
    return n / (time.perf_counter() - t0)


def ours(db_url: str, redis_url: str, n: int, workdir: Path) -> tuple[float, float]:
    from ggpo_batch.config.settings import load_settings
    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine
    from ggpo_batch.spec.parse import load_spec

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    ledger = connect(db_url)
    settings = load_settings({"GGPO_DB_URL": db_url, "GGPO_REDIS_URL": redis_url, "GGPO_DATA_DIR": str(workdir),
                              "GGPO_USER": "bench", "GGPO_QUEUE": "bench-ggpo"})
    # One small enqueue first, as the raw side's connection and imports are warm too: the figure
    # is the steady-state rate, not a process's one-time imports (about 1 s here).
    warm = workdir / "warmup.toml"
    warm.write_text(_spec_text(ARMS))
    enqueue_spec(ledger, settings, load_spec(warm), actor="bench")
    path = workdir / "bench.toml"
    path.write_text(_spec_text(n))
    t0 = time.perf_counter()
    spec = load_spec(path)
    res = enqueue_spec(ledger, settings, spec, actor="bench")
    dt = time.perf_counter() - t0
    assert res.enqueued == n, res.enqueued
    t1 = time.perf_counter()
    again = enqueue_spec(ledger, settings, load_spec(path), actor="bench")  # idempotent re-enqueue
    dt_again = time.perf_counter() - t1
    assert again.enqueued == 0
    ledger.engine.dispose()
    return n / dt, dt_again


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--redis-db", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    conn = redis.Redis.from_url(redis_url)
    rounds: list[tuple[float, float, float, float]] = []  # raw jobs/s, ours runs/s, re-enqueue s, writer jobs/s
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            if args.db == "sqlite":
                db_url = f"sqlite:///{work / 'bench.sqlite3'}"
                cleanup = None
            else:
                import psycopg

                name = f"ggpo_bench_{uuid.uuid4().hex[:8]}"
                with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                    c.execute(f'CREATE DATABASE "{name}"')
                db_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
                cleanup = name
            try:
                conn.flushdb()
                raw = raw_rq(conn, args.runs)
                conn.flushdb()
                mine, again_s = ours(db_url, redis_url, args.runs, work)
                conn.flushdb()
                writer = writer_only(conn, redis_url, args.runs)
                rounds.append((raw, mine, again_s, writer))
            finally:
                conn.flushdb()
                if cleanup:
                    import psycopg

                    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
                        c.execute(f'DROP DATABASE IF EXISTS "{cleanup}" WITH (FORCE)')
    print(f"runs                      {args.runs}")
    print(f"ledger                    {args.db}")
    for i, (raw, mine, again_s, writer) in enumerate(rounds, 1):
        print(f"round {i}: raw RQ enqueue_many {raw:7.0f} jobs/s, ggpo-batch enqueue {mine:7.0f} runs/s "
              f"(spec parse + ledger + RQ), re-enqueue (no-op) {again_s:.3f} s, ratio {mine / raw:.2f}")
        print(f"         our RQ writer alone {writer:7.0f} jobs/s ({writer / raw:.2f}x raw RQ); "
              f"outside Redis {1e6 / mine - 1e6 / writer:5.1f} us/run, against raw RQ's {1e6 / raw:5.1f} us/job")
    ratio = statistics.median(mine / raw for raw, mine, _, _ in rounds)
    print(f"ratio ggpo/raw            {ratio:10.2f}   (median of {len(rounds)}; goal >= 0.70: "
          f"{'meets' if ratio >= 0.7 else 'MISSES'})")


if __name__ == "__main__":
    main()
