"""What notifications cost a worker, measured in one run: (1) a run's end when it writes an outbox row
(a failure) against one that writes none (a success), the same transition otherwise; (2) reconcile's
notification step with no sink (the baseline), a live webhook, and a dead one that accepts
connections and never answers (first pass: one timeout; the passes after, in its back-off: nothing).
A dead sink is never contacted by a transition: the ledger does not know the sinks.

    PYTHONPATH=. .venv/bin/python tools/bench/notify_dead_sink.py [--runs 200] [--db-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from ggpo_batch.config.settings import load_settings
from ggpo_batch.ledger import connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.notify.cycle import notify_cycle
from tests.support.receivers import BlackHole, HttpReceiver, Received, free_port
from tools.bench.heartbeat_copy import running_runs

TIMEOUT = "1.0"


def ledger_with_runs(db_url: str, name: str, n: int):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    return led, running_runs(led, name, n)


def ends(led, keys, state: str) -> float:  # type: ignore[no-untyped-def]
    """Median seconds of ending each run as `state`."""
    times = []
    for k in keys:
        t0 = time.perf_counter()
        led.mark_finished(k, 1, attempt_state=state, run_state=state, actor="b", reason=None if state == "succeeded"
                          else "exit 1")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cycle(led, settings) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    notify_cycle(led, settings)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--db-url", help="a ledger database (default: a new SQLite file); its tables are added to")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db_url = args.db_url or f"sqlite:///{tmp}/ledger.sqlite3"
        base = {"GGPO_DB_URL": db_url, "GGPO_DATA_DIR": tmp, "GGPO_USER": "bench"}
        tag = f"b{int(time.time())}"
        led, ok = ledger_with_runs(db_url, f"{tag}ok", args.runs)
        _, bad = ledger_with_runs(db_url, f"{tag}bad", args.runs)
        quiet, noisy = ends(led, ok, "succeeded"), ends(led, bad, "failed")
        print(f"run end, median of {args.runs}: no notification {quiet * 1e3:.2f} ms, with its outbox row "
              f"{noisy * 1e3:.2f} ms, ratio {noisy / quiet:.2f}")
        none = load_settings(base)
        cycle(led, none)  # records the two experiments' ends (report + headline): not what is measured
        live_port, dead_port = free_port(), free_port()
        got = Received()
        receiver, hole = HttpReceiver(live_port, got), BlackHole(dead_port)
        try:
            live = load_settings({**base, "GGPO_NOTIFY_WEBHOOK_URLS": f"http://127.0.0.1:{live_port}/h",
                                  "GGPO_NOTIFY_TIMEOUT_SECONDS": TIMEOUT, "GGPO_NOTIFY_MAX_PER_PASS": "1000"})
            sent = cycle(led, live)
            dead_settings = load_settings({**base, "GGPO_NOTIFY_WEBHOOK_URLS": f"http://127.0.0.1:{dead_port}/h",
                                           "GGPO_NOTIFY_TIMEOUT_SECONDS": TIMEOUT})
            _, more = ledger_with_runs(db_url, f"{tag}more", 20)
            ends(led, more, "failed")
            first = cycle(led, dead_settings)
            pairs = [(cycle(led, none), cycle(led, dead_settings)) for _ in range(9)]  # the same ledger, alternately
            baseline, later = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        finally:
            receiver.stop()
            hole.stop()
        print(f"reconcile's notification step: a live webhook sending {len(got.items)} notices {sent * 1e3:.1f} ms; "
              f"a dead webhook (timeout {TIMEOUT} s): first pass {first * 1e3:.0f} ms ({len(hole.accepted)} "
              f"connection), then in its back-off {later * 1e3:.1f} ms a pass vs {baseline * 1e3:.1f} ms with no sink, "
              f"ratio {later / baseline:.2f}")
        led.engine.dispose()


if __name__ == "__main__":
    main()
