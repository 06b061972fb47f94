"""Benchmark: the control plane at 1k / 10k / 100k runs, on SQLite and PostgreSQL.

For each backend and size it builds a ledger of N queued runs (one experiment, 10 arms) with the
same N jobs on a real Redis queue, then times each command as a user runs it (a fresh process,
median of `--repeat`) and records its peak memory (the child's max RSS):

    status                      the default view (totals in SQL, the runs that need a look)
    status -e E -s failed       a filter that shows nothing (Redis must stay untouched)
    reconcile                   an idle cycle (nothing changed: compares id sets)
    ledger export --format csv  streamed to /dev/null (constant memory)

and prints each figure with the ratio 100k / 1k. Its first line is `status` on an empty SQLite
ledger, against two baselines timed in the same run, interleaved with it: a bare interpreter and
`python -c "import sqlalchemy, click"` (what any command of this CLI imports). Those start-up runs
write and reuse compiled bytecode in a private PYTHONPYCACHEPREFIX, as an installed ggpo-batch does,
even where PYTHONDONTWRITEBYTECODE is set. Goals (issue 14): status (both) within 1.5x of 1k at
100k; reconcile within 2x and under 150 MiB; empty-ledger status under 0.3 s.

    .venv/bin/python tools/bench/control_plane.py [--sizes 1000,10000,100000] [--backends sqlite,postgresql]
    .venv/bin/python tools/bench/control_plane.py --empty-only     # the first line alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]
ARMS = 10
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
COMMANDS = {
    "status": ["status"],
    "status -s failed": ["status", "-e", "cp", "-s", "failed"],
    "reconcile": ["reconcile"],
    "export csv": ["ledger", "export", "--format", "csv", "--table", "runs"],  # to stdout, which is discarded
}


def run_cli(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds, peak MiB) of one `ggpo-batch ARGS` in a fresh process. The peak is the child's max
    RSS as GNU time reports it (a child forked from this process would inherit its high-water mark)."""
    with tempfile.NamedTemporaryFile("r") as rss:
        timer = ["/usr/bin/time", "-q", "-f", "%M", "-o", rss.name] if Path("/usr/bin/time").exists() else []
        t0 = time.perf_counter()
        proc = subprocess.run([*timer, sys.executable, "-m", "ggpo_batch.cli", *args], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"ggpo-batch {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        kib = rss.read().strip().splitlines()[-1] if timer else "nan"
    return seconds, float(kib) / 1024.0


def wall(argv: list[str], env: dict[str, str]) -> float:
    """Seconds of one process, start to exit, output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return seconds


def empty_status_line(env: dict[str, str], workdir: Path, repeat: int) -> str:
    """`status` on an empty ledger (the `ggpo-batch` script, and `python -m ggpo_batch.cli`) against a
    bare interpreter and `import sqlalchemy, click`, each the median of `repeat` runs taken in turn."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
    script = Path(sys.executable).with_name("ggpo-batch")
    kinds = {"bare": [sys.executable, "-c", "pass"],
             "sqlalchemy+click": [sys.executable, "-c", "import sqlalchemy, click"],
             "status": [str(script), "status"] if script.exists() else [sys.executable, "-m", "ggpo_batch.cli", "status"],
             "status -m": [sys.executable, "-m", "ggpo_batch.cli", "status"]}
    for argv in kinds.values():  # compile and cache the bytecode once
        wall(argv, env)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeat):
        for kind, argv in kinds.items():
            times[kind].append(wall(argv, env))
    med = {k: statistics.median(v) for k, v in times.items()}
    verdict = "meets" if med["status"] < 0.3 else "MISSES"
    return (f"status on an empty ledger: median {med['status']:.3f} s, {med['status'] / med['sqlalchemy+click']:.2f}x "
            f"`import sqlalchemy, click` ({med['sqlalchemy+click']:.3f} s), bare interpreter {med['bare']:.3f} s, "
            f"`python -m` {med['status -m']:.3f} s; {verdict} goal < 0.3 s "
            f"(status runs {', '.join(f'{t:.3f}' for t in times['status'])}; median of {repeat})")


def fill(db_url: str, redis_url: str, n: int) -> None:
    """N queued runs of experiment `cp` in the ledger, and their N jobs on queue `cpq`."""
    from ggpo_batch.control.queue import RunQueue
    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    keys = [f"cp-v1-{i // ARMS}-a{i % ARMS}" for i in range(n)]
    runs = [NewRun(run_key=k, arm=f"a{i % ARMS}", seed=i // ARMS, config_hash="c", run_spec={"run_key": k},
                   estimated_gpu_hours=0.76) for i, k in enumerate(keys)]
    led.create_experiment(name="cp", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="bench", queue="cpq", runs=runs)
    led.engine.dispose()
    RunQueue.from_url(redis_url, "cpq").enqueue(keys)


def backend_url(backend: str, workdir: Path, tag: str) -> tuple[str, callable]:  # type: ignore[valid-type]
    if backend == "sqlite":
        return f"sqlite:///{workdir / f'{tag}.sqlite3'}", lambda: None
    import psycopg

    name = f"ggpo_bench_{tag}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--redis-db", type=int, default=13)
    ap.add_argument("--empty-only", action="store_true", help="Only the first line: status on an empty ledger.")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    conn = redis.Redis.from_url(redis_url)
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    results: dict[tuple[str, str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        env = {**base_env, "GGPO_DB_URL": f"sqlite:///{workdir / 'empty.sqlite3'}", "GGPO_REDIS_URL": redis_url,
               "GGPO_DATA_DIR": str(workdir / "data"), "GGPO_USER": "bench", "GGPO_QUEUE": "cpq"}
        from ggpo_batch.ledger import upgrade
        from ggpo_batch.ledger.db import make_engine

        engine = make_engine(env["GGPO_DB_URL"])
        upgrade(engine)
        engine.dispose()
        print(empty_status_line(env, workdir, max(5, args.repeat)), flush=True)
        if args.empty_only:
            return 0
        for backend in args.backends.split(","):
            for n in sizes:
                conn.flushdb()
                url, drop = backend_url(backend, workdir, f"{backend}{n}")
                try:
                    t0 = time.perf_counter()
                    fill(url, redis_url, n)
                    print(f"[{backend} {n:>7,} runs] built in {time.perf_counter() - t0:.1f} s", flush=True)
                    env = {**env, "GGPO_DB_URL": url}
                    for name, cli_args in COMMANDS.items():
                        runs = [run_cli(cli_args, env) for _ in range(args.repeat)]
                        results[(backend, name, n)] = (statistics.median(t for t, _ in runs),
                                                       max(m for _, m in runs))
                        t, m = results[(backend, name, n)]
                        print(f"  {name:<18} {t:7.3f} s  {m:7.1f} MiB", flush=True)
                finally:
                    drop()
        conn.flushdb()
    lo, hi = sizes[0], sizes[-1]
    print(f"\nratio {hi:,} / {lo:,} runs (time; peak memory at {hi:,})")
    goals = {"status": 1.5, "status -s failed": 1.5, "reconcile": 2.0, "export csv": None}
    ok = True
    for backend in args.backends.split(","):
        for name, goal in goals.items():
            (t_lo, _), (t_hi, m_hi) = results[(backend, name, lo)], results[(backend, name, hi)]
            ratio = t_hi / t_lo
            verdict = "" if goal is None else ("  meets" if ratio <= goal else "  MISSES") + f" goal <= {goal}x"
            if name == "reconcile":
                verdict += f", {m_hi:.0f} MiB " + ("meets" if m_hi < 150 else "MISSES") + " goal < 150 MiB"
                ok &= m_hi < 150
            ok &= goal is None or ratio <= goal
            print(f"  {backend:<10} {name:<18} {ratio:5.2f}x  ({t_lo:.3f} s -> {t_hi:.3f} s, {m_hi:.0f} MiB){verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
