"""Benchmark: a forked rank's DeepSpeed engine start, from a preload without and with what a rank
imports only once it runs (`train.run.job.RANK_TIME_IMPORTS`).

A fork server (train/run/rankfork.py, executor/rank_server.py) imports torch, DeepSpeed and the
trainer once and forks its ranks. A rank then imports the retriever's bm25s and the checkpoint
writer as it starts: in every forked rank unless the preload took them. (DeepSpeed's Muon optimizer,
which `deepspeed.initialize` of a ZeRO engine imports, came from here too; `import_deepspeed` now
loads it, uncompiled, in every rank: tools/bench/fresh_rank_imports.py.) This forks REPEAT one-rank
"ranks" (gloo, world size 1) that each do what a rank does before its first step (`rank_start`: the
policy, its ZeRO-2 engine, the retriever), first from the preload without those imports (the
baseline, as before), then with them, and prints each leg's CPU-seconds of the ranks (their own
rusage), and the ratio. Nothing else should run on the machine.

    .venv/bin/python tools/bench/rank_time_imports.py [--repeat 4]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def rank_start() -> None:
    """What a rank does before its first step, as `Trainer.__init__` does it: its process group (one
    rank, gloo), the task's retriever, the built-in policy and its ZeRO-2 engine; and the checkpoint
    writer its export imports. tests/train/test_rankfork.py checks that it imports nothing heavy in a
    forked rank."""
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.deepspeed_import import import_deepspeed
    from ggpo_batch.train.policy.engine_config import policy_engine_config
    from ggpo_batch.train.policy.model import initial_policy
    from ggpo_batch.train.pretrained import hf  # noqa: F401
    from ggpo_batch.train.task.retrieval import Retriever

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    deepspeed = import_deepspeed(False)
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = TrainConfig()
    model = initial_policy(cfg, 7, None)
    config = policy_engine_config(model, zero_stage=2, passes=1, grad_clip=cfg.grad_clip, lr=cfg.lr, bf16=False,
                                  fp16=False, gpu=False)
    deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    Retriever(())


def leg(repeat: int) -> float:
    """CPU-seconds of `repeat` forked ranks, one after another."""
    total = 0.0
    for _ in range(repeat):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                rank_start()
            except BaseException as exc:  # noqa: BLE001 - the child reports and exits, never returns
                print(f"rank failed: {exc!r}", file=sys.stderr)
                code = 1
            os._exit(code)
        _pid, status, usage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit("a rank failed")
        total += usage.ru_utime + usage.ru_stime
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=4, help="ranks forked in each leg")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from ggpo_batch.train.run import job

    rank_time = job.RANK_TIME_IMPORTS
    job.RANK_TIME_IMPORTS = ()
    job.preload()  # the baseline's preload: torch, DeepSpeed, the trainer
    before = leg(a.repeat)
    for name in rank_time:
        importlib.import_module(name)  # now as job.preload() does
    after = leg(a.repeat)
    print(f"{a.repeat} forked ranks to a ZeRO-2 engine: {before:.2f} CPU-s from the preload without "
          f"RANK_TIME_IMPORTS, {after:.2f} with them ({before / a.repeat:.2f} against {after / a.repeat:.2f} "
          f"a rank): {before / after:.1f}x less")


if __name__ == "__main__":
    main()
