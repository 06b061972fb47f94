"""Wall time of a one-run `ggpo-batch train` (the built-in model on the CPU, one rank, a 3 s loop
budget) with MLflow tracking off (the baseline, measured in the same run), on a new SQLite store,
and with GGPO_MLFLOW_URI at a closed port, at a server that accepts and never answers, and at a
PostgreSQL server that refuses the store (a database it does not have): tracking never holds
training (ggpo_batch/train/run/tracking.py), so each unusable store adds at most its bounds.

    PYTHONPATH=. .venv/bin/python tools/bench/train_tracking.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = """[experiment]
name = "bench-tracking"
method = "ggpo"
seeds = [7]
gpus = 4
executor = "local"
loop_budget_seconds = 3
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


def silent_port() -> int:
    """A port whose connections are accepted and never answered (for the life of this process)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    return int(server.getsockname()[1])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(root: Path, name: str, uri: str | None) -> tuple[float, str]:
    """(wall seconds, the attempt's tracking state) of one `train`."""
    spec = root / "spec.toml"
    spec.write_text(SPEC)
    out = root / name / "record.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_DATA_DIR=str(root / "data"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    if uri:
        env["GGPO_MLFLOW_URI"] = uri
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "train", str(spec), "--arm", "clean", "--seed", "7",
                           "--nproc", "1", "-o", str(out)], env=env, cwd=REPO, capture_output=True, text=True,
                          check=False)
    seconds = time.monotonic() - t0
    if done.returncode:
        raise SystemExit(f"train ({name}) failed: {done.stderr[-2000:]}")
    state = json.loads(out.with_name("record.json.details.json").read_text())["tracking"]
    return seconds, state["state"] + (f": {state['reason']}" if "reason" in state else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432",
                    help="A PostgreSQL server (no database): the refusing store is a database it does not have.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ggpo-bench-tracking-") as tmp:
        root = Path(tmp)
        cases = [("off (baseline)", None), ("new SQLite store", f"sqlite:///{root / 'mlflow.db'}"),
                 ("closed port", f"http://u:pw@127.0.0.1:{closed_port()}"),
                 ("silent server", f"http://u:pw@127.0.0.1:{silent_port()}"),
                 ("PostgreSQL refuses", f"{args.pg}/ggpo_bench_no_such_db")]
        base = None
        print(f"{'tracking':<20} {'train s':>8} {'+ s':>6} {'x off':>6}  state")
        for i, (name, uri) in enumerate(cases):
            seconds, state = train(root, f"run{i}", uri)
            base = base or seconds
            print(f"{name:<20} {seconds:>8.1f} {seconds - base:>6.1f} {seconds / base:>6.2f}  {state[:90]}", flush=True)


if __name__ == "__main__":
    main()
