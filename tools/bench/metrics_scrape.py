"""Benchmark: a scrape of the dashboard's `/metrics` against `status`, at 100,000 runs, in the same run.

For each backend it builds the ledger `tools/bench/costs.py` builds (N runs in 10 experiments on 2
queues, each with one booked attempt, one run in 20 decided not reproduced), starts a real
`ggpo-batch dashboard` on it, and times over HTTP, taking turns, median of `--repeat`:

    GET /metrics      the ledger's figures, read at scrape time (reporting/ledger_metrics.py)
    GET /api/status   exactly `status --json` (the default view: totals in SQL, the runs that need a look)

then the same two in this process, without HTTP (`LedgerCollector` against `experiment_status`),
and prints each ratio scrape / status. Goal (issue 41): a scrape costs no more than `status` (ratio <= 1).

    .venv/bin/python tools/bench/metrics_scrape.py [--runs 100000] [--backends sqlite,postgresql] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_plane import backend_url  # the same databases as the other benchmarks
from costs import fill  # the same 100k-run ledger as `costs`

from ggpo_batch.common.netutil import free_port

REPO = Path(__file__).resolve().parents[2]


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=300) as r:
        r.read()
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status}")
    return time.perf_counter() - t0


def over_http(env: dict[str, str], repeat: int) -> dict[str, float]:
    """Median seconds of GET /metrics and GET /api/status on a real dashboard, taken in turn."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "dashboard", "--port", str(port)], env=env,
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                _get(base + "/healthz")
                break
            except OSError:
                if proc.poll() is not None:
                    raise SystemExit(f"dashboard exited {proc.returncode}: {proc.stderr.read()[-800:]}") from None
                time.sleep(0.1)
        paths = {"scrape": "/metrics", "status": "/api/status"}
        for path in paths.values():  # warm: first queries, page cache
            _get(base + path)
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(repeat):
            for kind, path in paths.items():
                times[kind].append(_get(base + path))
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def in_process(db_url: str, repeat: int) -> dict[str, float]:
    """Median seconds of the collector's scrape and of `experiment_status` (status' library call)."""
    from ggpo_batch.ledger import connect
    from ggpo_batch.reporting.ledger_metrics import LedgerCollector, exposition
    from ggpo_batch.reporting.status import StatusQuery, experiment_status

    led = connect(db_url)
    collector = LedgerCollector(led, default_queue="ggpo")
    query = StatusQuery.of()
    calls = {"scrape": lambda: exposition(collector),
             "status": lambda: experiment_status(led, attention=query.attention, limit=query.limit)}
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(repeat):
        for kind, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[kind].append(time.perf_counter() - t0)
    led.engine.dispose()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
        for backend in args.backends.split(","):
            url, drop = backend_url(backend, workdir, f"scrape{backend}")
            try:
                t0 = time.perf_counter()
                fill(url, args.runs)
                print(f"[{backend} {args.runs:,} runs] built in {time.perf_counter() - t0:.1f} s", flush=True)
                env = {**base, "GGPO_DB_URL": url, "GGPO_DATA_DIR": str(workdir / "data"),
                       "GGPO_REDIS_URL": "memory://"}  # no Redis: neither reads it with nothing queued
                for where, figures in (("HTTP", over_http(env, args.repeat)), ("in process", in_process(url, args.repeat))):
                    ratio = figures["scrape"] / figures["status"]
                    ok &= ratio <= 1.0
                    print(f"  {where:<10} scrape {figures['scrape'] * 1000:8.1f} ms   status {figures['status'] * 1000:8.1f} ms"
                          f"   ratio {ratio:.2f} ({'meets' if ratio <= 1.0 else 'MISSES'} goal <= 1)", flush=True)
            finally:
                drop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
