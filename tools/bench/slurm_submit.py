"""Submission at scale against the real dev Slurm: 500 runs through the worker's submit path, sbatch paced
by the shared token bucket; then one reconcile cycle over all of them.

Every Slurm client command anyone runs (ours, submitit's) is counted by one wrapper: PATH starts with
a folder of shims for sbatch, squeue, sacct, scontrol and scancel that log the call and exec the real
program. Baselines measured in the same run: the previous submit path (look the attempt up by name
with squeue and sacct, twice, then sbatch, unpaced) on a smaller batch, and a reconcile that asks
sacct once per job. Runs use the held profile (dev-cluster-held): requested and accounted, never
started, all cancelled at the end.

    PYTHONPATH=. .venv/bin/python tools/bench/slurm_submit.py [--runs 500] [--baseline-runs 50] [--workers 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

SLURM_PROGRAMS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = {seeds}
gpus = 4
loop_budget_seconds = 60
executor = "slurm"
profile = "dev-cluster-held"
max_gpu_hours = 100000.0
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
"""


def install_shims(folder: Path, log: Path) -> None:
    """Wrap every Slurm client in PATH: one line per call in `log` (program, time), then the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    for prog in SLURM_PROGRAMS:
        real = shutil.which(prog)
        if real is None:
            raise SystemExit(f"{prog} not found: start the dev cluster (slurm/dev-cluster/up.sh)")
        shim = folder / prog
        shim.write_text(f'#!/bin/sh\necho "{prog} $(date +%s.%N)" >> "{log}"\nexec "{real}" "$@"\n')
        shim.chmod(0o755)
    os.environ["PATH"] = f"{folder}:{os.environ['PATH']}"


def calls(log: Path, since: int = 0) -> tuple[Counter[str], list[float], int]:
    """(calls per program, sbatch times) logged after line `since`, and the line count now."""
    lines = log.read_text().splitlines() if log.exists() else []
    counts: Counter[str] = Counter()
    sbatch: list[float] = []
    for line in lines[since:]:
        prog, _, at = line.partition(" ")
        counts[prog] += 1
        if prog == "sbatch":
            sbatch.append(float(at))
    return counts, sbatch, len(lines)


def max_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    best, j = 0, 0
    for i in range(len(times)):
        while times[i] - times[j] > window:
            j += 1
        best = max(best, i - j + 1)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--baseline-runs", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4, help="threads submitting at once, as workers would")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/11")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="ggpo-bench-submit-"))
    log = tmp / "slurm-calls.log"
    install_shims(tmp / "shims", log)

    from ggpo_batch.config.settings import load_settings
    from ggpo_batch.contracts.allocation import attempt_folder
    from ggpo_batch.contracts.runspec import RunSpec
    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.control.queue import RunQueue
    from ggpo_batch.control.reconcile import reconcile
    from ggpo_batch.control.worker import submit_run
    from ggpo_batch.executor import make_executor
    from ggpo_batch.executor.pacing import Unpaced, bucket_key
    from ggpo_batch.executor.sacct import Sacct
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine
    from ggpo_batch.spec.parse import load_spec

    tag = uuid.uuid4().hex[:8]
    db_url = f"sqlite:///{tmp / 'ledger.sqlite3'}"
    upgrade(make_engine(db_url))
    settings = load_settings({"GGPO_DB_URL": db_url, "GGPO_REDIS_URL": args.redis_url, "GGPO_DATA_DIR": str(tmp / "data"),
                              "GGPO_USER": f"bench-{tag}", "GGPO_QUEUE": f"bench-{tag}"})
    ledger = connect(db_url)
    import redis

    redis.Redis.from_url(args.redis_url).delete(bucket_key(os.environ.get("USER", "root")))
    n_all = args.runs + args.baseline_runs
    spec_path = tmp / "bench.toml"
    spec_path.write_text(SPEC.format(name=f"bench-{tag}", seeds=list(range(1, n_all + 1))))
    keys = sorted((r.run_key for r in enqueue_spec(ledger, settings, load_spec(spec_path), actor="bench").runs),
                  key=lambda k: int(k.split("-")[-2]))
    queue = RunQueue.from_url(settings.redis_url, settings.queue)
    queue.queue.empty()  # the bench calls the worker's submit path itself
    base_keys, paced_keys = keys[:args.baseline_runs], keys[args.baseline_runs:]
    job_ids: list[str] = []
    try:
        # -- baseline: the previous submit path, unpaced: find (squeue, sacct) then submit (finds again) --
        ex = make_executor("slurm", jobs_dir=settings.jobs_dir, profile="dev-cluster-held")
        ex.pacer = Unpaced()  # type: ignore[attr-defined]
        _, _, mark = calls(log)
        t0 = time.monotonic()
        for key in base_keys:
            spec = RunSpec.from_dict(ledger.submission_view(key)[1])
            att = ledger.begin_attempt(key, executor="slurm", gpus=spec.allocated_gpus, actor="bench", worker="bench")
            folder = attempt_folder(settings.jobs_dir, key, att.number)
            job_id = ex.find(spec, att.number, folder) or ex.submit(spec, att.number, folder, lookup=True)
            ledger.mark_submitted(key, att.number, job_id=job_id, actor="bench")
            job_ids.append(job_id)
        base_s = time.monotonic() - t0
        base_counts, base_sbatch, mark = calls(log, mark)

        # -- now: the worker's path (submit_run), workers sharing the Redis bucket --
        todo = list(paced_keys)
        lock = threading.Lock()
        errors: list[str] = []

        def worker(i: int) -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    key = todo.pop(0)
                out = submit_run(ledger, settings, key, worker=f"bench-{i}")
                if "job_id" in out:
                    with lock:
                        job_ids.append(out["job_id"])
                else:
                    errors.append(f"{key}: {out}")

        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        paced_s = time.monotonic() - t0
        paced_counts, paced_sbatch, mark = calls(log, mark)
        if errors:
            print(f"{len(errors)} submissions failed, e.g. {errors[0]}", file=sys.stderr)

        # -- one reconcile cycle over every active attempt, and the per-job baseline --
        time.sleep(3)  # slurmdbd records submissions a moment after sbatch
        t0 = time.monotonic()
        rep = reconcile(ledger, settings, [queue], actor="bench")
        cycle_s = time.monotonic() - t0
        cycle_counts, _, mark = calls(log, mark)
        t0 = time.monotonic()
        for j in job_ids:
            Sacct().accounts([j])
        per_job_s = time.monotonic() - t0
        per_job_counts, _, mark = calls(log, mark)
    finally:
        ids = sorted(set(job_ids))
        for i in range(0, len(ids), 200):
            subprocess.run(["scancel", *ids[i:i + 200]], check=False)

    n_base, n_paced = len(base_keys), len(paced_sbatch)
    base_rate = len(base_sbatch) / base_s if base_s else float("nan")
    span = (paced_sbatch[-1] - paced_sbatch[0]) if len(paced_sbatch) > 1 else float("nan")
    after_burst = paced_sbatch[30:]
    steady = (len(after_burst) - 1) / (after_burst[-1] - after_burst[0]) if len(after_burst) > 1 else float("nan")
    per_sub_base = sum(base_counts.values()) / max(1, n_base)
    per_sub_now = sum(paced_counts.values()) / max(1, n_paced)
    print(f"submit: {n_paced} runs by {args.workers} workers through submit_run, sbatch paced by the Redis bucket "
          f"(30 tokens, 2/s): {n_paced / paced_s:.2f} sbatch/s overall ({paced_s:.0f} s), {steady:.2f}/s after the "
          f"first 30; most in any 1 s window {max_in_window(paced_sbatch, 1.0)}, in any 10 s "
          f"{max_in_window(paced_sbatch, 10.0)} (bucket allows 30+2x10 = 50); first-to-last {span:.0f} s")
    print(f"  Slurm calls per submission: {per_sub_now:.2f} ({dict(paced_counts)})")
    print(f"baseline submit (previous path: squeue+sacct lookup twice, then sbatch, unpaced), {n_base} runs: "
          f"{base_rate:.2f} sbatch/s, Slurm calls per submission {per_sub_base:.2f} ({dict(base_counts)})")
    print(f"  ratio Slurm calls per submission, baseline / now: {per_sub_base / per_sub_now:.2f}")
    print(f"reconcile: one cycle over {rep.polled} active attempts: {sum(cycle_counts.values())} Slurm calls "
          f"({dict(cycle_counts)}) in {cycle_s:.2f} s")
    print(f"baseline reconcile (sacct once per job): {sum(per_job_counts.values())} Slurm calls in {per_job_s:.1f} s; "
          f"ratio calls {sum(per_job_counts.values()) / max(1, sum(cycle_counts.values())):.0f}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
