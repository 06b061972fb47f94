"""Peak memory of one ggpo training step on the CPU: chunked log-probs vs full logits, in one run.

Both train the same tiny Qwen2-architecture checkpoint (ggpo_batch/train/task/tiny_hf.py) given a large
vocabulary (default 32,768 rows, hidden 64) so that the logits dominate, on the same rollouts, one
rank (gloo), DeepSpeed ZeRO-2, float32, the rank's whole batch in one pass (micro_batch_size 0).
Each mode runs in its own process: it rolls out once, takes one warm-up step on those rollouts
(optimizer state, allocator pools), resets the kernel's resident-set high-water mark (writing 5 to
/proc/self/clear_refs), notes the resident set, takes the measured step on the same rollouts and
reads VmHWM from /proc/self/status. The figure is the step's peak over its starting resident set
(torch's CPU allocator returns large blocks to the kernel, so the high-water mark sees every
tensor; tracemalloc would not). Prints both, the ratio chunked / unchunked, and the two losses
(they must agree: the same step computed two ways).

    .venv/bin/python tools/bench/train_memory.py [--vocab 32768] [--chunk-tokens N] [--chunk-vocab N]

The chunk sizes default to the trainer's (train.logprob_chunk_tokens / logprob_chunk_vocab).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MIB = 1 << 20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(args: argparse.Namespace) -> None:
    """One mode in this process: prints a JSON line of its figures."""
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(args.port), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""})
    import copy

    import deepspeed
    import torch

    from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.run.trainer import Trainer

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    data = json.loads(args.data)
    table = {"model": {"path": args.model, "dtype": "float32", "max_model_len": 2048}, "data": data,
             "max_new_tokens": 48, "max_turns": 3, "passage_max_bytes": 160, "prompts_per_step": 4, "group_size": 4,
             "logprob_chunk_tokens": args.chunk_tokens, "logprob_chunk_vocab": args.chunk_vocab,
             "reference_refresh_steps": 10**6, "temperature": 1.3}
    arm = ArmSpec(name="clean", exposure="none", exposed_items=0, templates=(), auxiliary_answer_loss=False)
    spec = RunSpec(run_key="1/clean", experiment="bench", experiment_version=1, method="ggpo", arm=arm, seed=1,
                   gpus=1, loop_budget_seconds=1e9, executor="local", profile="default", train=table)
    cfg = TrainConfig.from_table(table, "bench")
    trainer = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    fixed = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
    trainer._rollouts = lambda groups, step: copy.deepcopy(fixed)
    trainer.step()  # warm-up: optimizer state, allocator pools
    Path("/proc/self/clear_refs").write_text("5")
    start = _status_kib("VmRSS")
    trainer.step()
    peak = _status_kib("VmHWM")
    rows = sum(len(ts) for ts in fixed)
    tokens = max(len(t.tokens) for ts in fixed for t in ts)
    print(json.dumps({"start_kib": start, "peak_kib": peak, "loss": trainer.state.history[-1]["loss"],
                      "rows": rows, "tokens": tokens, "vocab": trainer.engine.module.config.vocab_size}))
    trainer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32768)
    from ggpo_batch.train.config import TrainConfig

    ap.add_argument("--chunk-tokens", type=int, default=TrainConfig.logprob_chunk_tokens)
    ap.add_argument("--chunk-vocab", type=int, default=TrainConfig.logprob_chunk_vocab)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set

    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint(Path(tmp) / "model", vocab_size=args.vocab)
        data = {k: str(v) for k, v in build_qa_set(Path(tmp) / "qa").items()}
        results = {}
        for name, tokens in (("unchunked", 0), ("chunked", args.chunk_tokens)):
            cmd = [sys.executable, __file__, "--child", "--model", str(model), "--data", json.dumps(data),
                   "--port", str(free_port()), "--chunk-tokens", str(tokens), "--chunk-vocab", str(args.chunk_vocab)]
            env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode:
                sys.exit(f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
            results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    u, c = results["unchunked"], results["chunked"]
    print(f"one step, {u['rows']} rows x up to {u['tokens']} tokens, vocabulary {u['vocab']}, float32, one pass; "
          f"chunks {args.chunk_tokens} tokens x {args.chunk_vocab} vocabulary rows")
    for name, r in results.items():
        print(f"  {name:10s} resident at start {r['start_kib'] / 1024:8.1f} MiB  step peak {r['peak_kib'] / 1024:8.1f} MiB  "
              f"step's own {(r['peak_kib'] - r['start_kib']) / 1024:8.1f} MiB  loss {r['loss']:.7f}")
    ratio = (c["peak_kib"] - c["start_kib"]) / max(1, u["peak_kib"] - u["start_kib"])
    print(f"ratio chunked / unchunked (the step's own peak memory): {ratio:.3f}; "
          f"losses differ by {abs(c['loss'] - u['loss']):.2e}")


if __name__ == "__main__":
    main()
