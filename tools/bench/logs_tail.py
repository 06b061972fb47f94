"""Time and peak memory of `ggpo-batch logs` on huge logs (ggpo_batch/reporting/joblogs.py, untrusted_files.py):
`-n 5` of a 256 MiB log that a progress bar wrote with "\\r" and no newline, `-n 5` and a whole
`logs` of 256 MiB without any line end, against `-n 5` of a 1 KiB log measured in the same run. Each
command runs as a child of /usr/bin/time (its own wall time and maximum resident set), output to
/dev/null; a SQLite ledger in a temporary folder.

    PYTHONPATH=. .venv/bin/python tools/bench/logs_tail.py [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ggpo_batch.config.settings import load_settings
from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.joblogs import log_path

KEY = "bench-v1-1-clean"
REPO = Path(__file__).resolve().parents[2]


def setup(root: Path) -> tuple[dict[str, str], Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_DATA_DIR=str(root), GGPO_USER="bench", GGPO_REDIS_URL="memory://",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    settings = load_settings(env)
    engine = make_engine(settings.db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(settings.db_url)
    led.create_experiment(name="bench", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="b", runs=[NewRun(run_key=KEY, arm="clean", seed=1, config_hash="c", run_spec={})])
    led.begin_attempt(KEY, executor="local", gpus=4, actor="b", worker="b")
    led.mark_submitted(KEY, 1, job_id="9", actor="b")
    led.engine.dispose()
    folder = attempt_folder(settings.jobs_dir, KEY, 1)
    folder.mkdir(parents=True)
    return env, folder


def write_progress_bar(path: Path, size: int) -> None:
    with open(path, "wb") as fh:
        n = 0
        while fh.tell() < size:
            fh.write(b"".join(f"\rstep {i:>9} [{'#' * (i % 50):<50}] loss 0.{i % 997:03d}".encode()
                              for i in range(n, n + 10_000)))
            n += 10_000


def write_no_line_end(path: Path, size: int) -> None:
    block = b"x" * (1 << 20)
    with open(path, "wb") as fh:
        fh.writelines(block for _ in range(size >> 20))


def measure(env: dict[str, str], args: list[str]) -> tuple[float, float]:
    """(wall seconds, peak resident MiB) of `ggpo-batch ARGS`, output discarded."""
    with tempfile.NamedTemporaryFile("r") as report:
        done = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", report.name, sys.executable, "-m",
                               "ggpo_batch.cli", *args], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"ggpo-batch {' '.join(args)} failed: {done.stderr[-2000:]}")
        seconds, kib = report.read().split()[-2:]
    return float(seconds), int(kib) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ggpo-bench-logs-") as tmp:
        env, folder = setup(Path(tmp))
        size = args.mib << 20
        log_path(folder, "9", 0, "stdout").write_text("hello\n" * 170)  # ~1 KiB
        write_progress_bar(log_path(folder, "9", 1, "stderr"), size)
        write_no_line_end(log_path(folder, "9", 2, "stderr"), size)
        cases = [("1 KiB log, -n 5 (baseline)", ["--rank", "0", "--stream", "stdout", "-n", "5"]),
                 (f"{args.mib} MiB progress bar (\\r, no \\n), -n 5", ["--rank", "1", "--stream", "stderr", "-n", "5"]),
                 (f"{args.mib} MiB without any line end, -n 5", ["--rank", "2", "--stream", "stderr", "-n", "5"]),
                 (f"{args.mib} MiB without any line end, whole", ["--rank", "2", "--stream", "stderr"])]
        base = None
        print(f"{'ggpo-batch logs ' + KEY + ' ...':<52} {'seconds':>8} {'peak MiB':>9} {'x baseline time':>16}")
        for name, extra in cases:
            seconds, mib = measure(env, ["logs", KEY, *extra])
            base = base or seconds
            print(f"{name:<52} {seconds:>8.2f} {mib:>9.1f} {seconds / base:>16.2f}", flush=True)


if __name__ == "__main__":
    main()
