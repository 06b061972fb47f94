"""Local runs: `train_local` starts N CPU ranks (gloo), forked from a preloaded server
(train/run/rankfork.py), and returns the record."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ...common.netutil import free_port
from ...contracts.runspec import RunSpec
from ...errors import GgpoError
from ..config import TrainConfig
from .job import Preempted, TimeLimitReached, TrainingJob, run_with_budget
from .rankfork import ForkServer, RankProcess

log = logging.getLogger(__name__)


def train_local(spec: RunSpec, output: Path, *, nproc: int = 2, budget_seconds: float | None = None,
                timeout: float | None = None) -> dict:
    """Run `spec` on `nproc` local CPU ranks; the record lands in `output` and is returned.

    `timing.gpus` is the spec's allocated GPU count even on CPU: the record bills what a real
    allocation of this run would hold, and tests keep the accounting identical to the cluster's.
    """
    spec = run_with_budget(spec, budget_seconds)
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    spec_file = output.with_name(output.name + ".spec.json")
    spec_file.write_text(spec.to_json())
    port = free_port()
    vllm = TrainConfig.from_table(spec.train, "<run spec>").rollout == "vllm"  # from a server that imported it
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DS_ACCELERATOR="cpu",
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), CUDA_VISIBLE_DEVICES="")
        env.pop("SUBMITIT_EXECUTOR", None)
        log_path = output.with_name(f"{output.name}.rank{rank}.log")
        procs.append((ForkServer.start_rank([str(spec_file), str(output)], env, log_path, vllm=vllm), log_path))
    failed = []

    def forward(signum: int, frame: object) -> None:  # a preempted launcher preempts its ranks
        for p, _ in procs:
            p.send_signal(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, forward) for s in (signal.SIGUSR1, signal.SIGTERM)}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for rank, (p, log_path) in enumerate(procs):
            try:
                rc = p.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise GgpoError(f"training did not finish in {timeout:g} s:\n" + _stack_dumps(procs)) from None
            if rc != 0:
                failed.append((rank, rc, log_path))
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for p, log_path in procs:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:  # its status never came back (the fork server died)
                    log.error("rank pid %d (log %s) killed; its exit status did not come back", p.pid, log_path)
    if failed:
        rank, rc, log_path = failed[0]
        for stopped in (Preempted, TimeLimitReached):  # every rank checkpointed and stopped together
            if all(f[1] == stopped.exit_code for f in failed) and len(failed) == nproc:
                raise stopped(f"all {nproc} ranks checkpointed in {output}.ckpt; call again to resume")
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        raise GgpoError(f"training rank {rank} exited {rc} (log {log_path}): {tail[0][:300]}")
    return json.loads(output.read_text())


def _stack_dumps(procs: list[tuple[RankProcess, Path]]) -> str:
    """Each live rank's Python stacks (SIGQUIT, registered in `main`) and the end of its log: a hang
    (ranks waiting in different collectives) names where each rank waits."""
    for p, _ in procs:
        p.send_signal(signal.SIGQUIT)
    time.sleep(2.0)
    parts = []
    for rank, (p, log_path) in enumerate(procs):
        lines = log_path.read_text(errors="replace").splitlines() if log_path.exists() else []
        state = "still running" if p.poll() is None else f"exited {p.returncode}"
        parts.append(f"-- rank {rank} ({state}), last lines of {log_path}:\n" + "\n".join(lines[-40:]))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """One rank of a local run (env vars name the rank); used by train_local."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("spec_file")
    ap.add_argument("output")
    args = ap.parse_args(argv)
    faulthandler.register(signal.SIGQUIT, all_threads=True)  # train_local asks a hung rank where it is
    try:
        TrainingJob(Path(args.spec_file).read_text(), args.output)()
    except GgpoError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
