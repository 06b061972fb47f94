"""The update phase of one step: packed passes against the passes before issue 27, on the same rows, in one run.

One rank (gloo), DeepSpeed ZeRO-2 on the CPU, float32, the tiny pretrained-format checkpoint
(`ggpo_batch.train.tiny_hf`, built offline into a temporary folder) with its weights set to a known
shape of episodes (`set_turn_lengths`: search calls of --search-mean words, answers of --answer-mean
words, geometric, so rows vary several-fold in length like real multi-turn rows). The trainer rolls
out one step (--prompts x --group trajectories, up to --turns turns, BM25 retrieval on) with its
torch sampler; every group is then given rewards 0 and 1 alternately, so every trajectory is a loss
row (a step where every group carries a signal). On those same rows the trainer's update
(`Trainer._update`: the policy's no-grad old log-probs, then forward/backward with the reference per
pass, one optimizer step) runs with each way of splitting them into passes:

- before, micro_batch_size = 1: the code before issue 27 (`today_plan`, kept here only): a fixed
  number of passes, the most rows a rank can hold (prompts x group), one row each, every row padded
  to the batch's longest (the passes sliced rows of the batch, not columns), filler passes for rows
  a rank does not have;
- before, micro_batch_size = 0: one pass of every row, padded to the batch's longest;
- packed: the trainer's own plan (`batch.agreed_plan`), rows longest first into the fewest passes of
  at most --budget padded tokens (default max_model_len: the tokens of one full-length row, what the
  memory estimate allows a pass at micro_batch_size = 1), each padded to its own longest row;
- packed, micro_batch_size = 1: one row a pass, each at its own length.

Printed per mode: passes per step, padded / non-padded tokens, the median seconds of the update over
--rounds (modes interleaved), and each mode's seconds per update against the two "before" modes.

    .venv/bin/python tools/bench/update_phase.py [--prompts 4] [--group 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def today_plan(n_rows: int, width: int, capacity: int, micro_batch_size: int) -> list:
    """The passes of the code before issue 27 (trainer._passes with batch.micro_batches): 1 pass of every
    row when micro_batch_size is 0, else ceil(capacity / micro_batch_size) passes of micro_batch_size
    rows in batch order, each row as wide as the batch's longest; a pass past the rank's rows is a filler."""
    from ggpo_batch.train.passes import FILLER, Pass

    if not micro_batch_size:
        return [Pass(tuple(range(n_rows)), width)]
    passes = []
    for j in range(-(-capacity // micro_batch_size)):
        rows = tuple(range(j * micro_batch_size, min(n_rows, (j + 1) * micro_batch_size)))
        passes.append(Pass(rows, width) if rows else FILLER)
    return passes


def build(folder: Path, *, answer_mean: float, search_mean: float, hidden: int,
          layers: int) -> tuple[Path, dict[str, Path]]:
    """The tiny checkpoint (`hidden` x `layers`) shaped for multi-turn episodes, and its QA set."""
    from ggpo_batch.train.tiny_hf import (
        build_checkpoint,
        build_qa_set,
        set_turn_lengths,
    )

    model = build_checkpoint(folder / "model", hidden=hidden, layers=layers, heads=4, kv_heads=2)
    set_turn_lengths(model, search_share=0.6, search_mean=search_mean, answer_mean=answer_mean)
    return model, build_qa_set(folder / "qa", n_train=64, n_eval=8)


def make_trainer(model: Path, files: dict[str, Path], train: dict, seed: int = 1):  # type: ignore[no-untyped-def,type-arg]
    """A one-rank trainer of the tiny checkpoint (the process group must exist)."""
    import torch

    from ggpo_batch.runspec import ArmSpec, RunSpec
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.trainer import Trainer

    table = {"model": {"path": str(model), "dtype": "float32", "max_model_len": train.pop("max_model_len", 4096)},
             "data": {k: str(v) for k, v in files.items()}, **train}
    arm = ArmSpec("clean")
    spec = RunSpec(run_key=f"{seed}/clean", experiment="bench", experiment_version=1, method="ggpo", arm=arm,
                   seed=seed, gpus=1, loop_budget_seconds=1e9, executor="local", profile="default", train=table)
    return Trainer(spec, TrainConfig.from_table(table, "bench"), rank=0, world=1, device=torch.device("cpu"),
                   budget_seconds=1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4, help="groups of the step on this rank")
    ap.add_argument("--group", type=int, default=4, help="trajectories per group (flagship: 16 rows a rank)")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=400, help="per turn (the flagship's)")
    ap.add_argument("--answer-mean", type=float, default=100.0, help="mean words of an answer")
    ap.add_argument("--search-mean", type=float, default=8.0, help="mean words of a search call")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256, help="the checkpoint's hidden size")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--budget", type=int, default=0, help="packed passes' max_tokens_per_pass (0: max_model_len)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: what a shared machine's load moves least
    import torch
    import torch.distributed as dist

    from ggpo_batch.netutil import free_port

    torch.set_num_threads(1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    from ggpo_batch.train.batch import agreed_plan

    folder = Path(tempfile.mkdtemp(prefix="ggpo-bench-update-"))
    try:
        model, files = build(folder, answer_mean=args.answer_mean, search_mean=args.search_mean, hidden=args.hidden,
                             layers=args.layers)
        trainer = make_trainer(model, files, {"prompts_per_step": args.prompts, "group_size": args.group,
                                              "max_turns": args.turns, "max_new_tokens": args.max_new_tokens,
                                              "passage_max_bytes": 200, "reference_refresh_steps": 1000,
                                              "max_model_len": args.max_model_len})
        trajs = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
        for ts in trajs:  # every group carries a signal: every trajectory is a loss row
            for j, t in enumerate(ts):
                t.reward = float(j % 2)
        lengths = [len(t.tokens) for ts in trajs for t in ts]
        width, capacity = max(lengths), args.prompts * args.group
        budget = args.budget or trainer.cfg.max_model_len
        modes = {
            "before, micro_batch_size=1": lambda attn: today_plan(len(lengths), width, capacity, 1),
            "before, micro_batch_size=0": lambda attn: today_plan(len(lengths), width, capacity, 0),
            f"packed, max_tokens_per_pass={budget}": lambda attn: agreed_plan(
                attn.sum(dim=1).tolist(), budget, 0, torch.device("cpu")),
            "packed, micro_batch_size=1": lambda attn: agreed_plan(
                attn.sum(dim=1).tolist(), budget, 1, torch.device("cpu")),
        }
        trainer._rollouts = lambda groups, step: copy.deepcopy(trajs)
        update, seconds, shape = trainer._update, {m: [] for m in modes}, {}
        mode_now = [""]

        def timed(batch, row_adv, aux, figures, plan):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            update(batch, row_adv, aux, figures, plan)
            seconds[mode_now[0]].append(time.perf_counter() - t0)
            real = int(batch[1].sum())
            shape[mode_now[0]] = (len(plan), sum(p.padded_tokens for p in plan) / real)

        trainer._update = timed
        trainer._plan = modes[f"packed, max_tokens_per_pass={budget}"]
        mode_now[0] = next(iter(modes))
        trainer.step()  # warm-up: the first step's allocations
        seconds[mode_now[0]].clear()
        for _ in range(args.rounds):
            for mode, planner in modes.items():
                mode_now[0], trainer._plan = mode, planner
                trainer.step()
        trainer.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{len(lengths)} rows of one step ({args.prompts} groups x {args.group}, up to {args.turns} turns): "
          f"{min(lengths)}-{width} tokens (median {statistics.median(lengths):.0f}); median of {args.rounds} "
          f"updates per mode, 1 CPU thread")
    base1 = statistics.median(seconds["before, micro_batch_size=1"])
    base0 = statistics.median(seconds["before, micro_batch_size=0"])
    for mode in modes:
        s = statistics.median(seconds[mode])
        n, ratio = shape[mode]
        print(f"{mode}: {n} passes, padded / non-padded tokens {ratio:.2f}, {s:.2f} s per update; "
              f"vs before mbs=1 {s / base1:.2f}x, vs before mbs=0 {s / base0:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
