"""The update phase of one step: packed passes against the passes before issue 27, and the old
log-probs from the update's own forward against their separate forward before issue 39, on the same
rows, in one run.

One rank (gloo), DeepSpeed ZeRO-2 on the CPU, float32, the tiny pretrained-format checkpoint
(`ggpo_batch.train.task.tiny_hf`, built offline into a temporary folder) with its weights set to a known
shape of episodes (`set_turn_lengths`: search calls of --search-mean words, answers of --answer-mean
words, geometric, so rows vary several-fold in length like real multi-turn rows). The trainer rolls
out one step (--prompts x --group trajectories, up to --turns turns, BM25 retrieval on) with its
torch sampler; every group is then given rewards 0 and 1 alternately, so every trajectory is a loss
row (a step where every group carries a signal). On those same rows the trainer's update
(`Trainer._update`: forward/backward with the reference per pass, the old log-probs of old_logprobs =
"policy" the update's own forward's, detached; one optimizer step) runs in each mode:

- before, micro_batch_size = 1: the passes before issue 27 (`today_plan`, kept here only): a fixed
  number of passes, the most rows a rank can hold (prompts x group), one row each, every row padded
  to the batch's longest (the passes sliced rows of the batch, not columns), filler passes for rows
  a rank does not have;
- before, micro_batch_size = 0: one pass of every row, padded to the batch's longest;
- packed: the trainer's own plan (`batch.agreed_plan`), rows longest first into the fewest passes of
  at most --budget padded tokens (default max_model_len: the tokens of one full-length row, what the
  memory estimate allows a pass at micro_batch_size = 1), each padded to its own longest row;
- packed, micro_batch_size = 1: one row a pass, each at its own length;
- packed, old log-probs recomputed: the packed plan with the old log-probs before issue 39
  (`recompute_old_logprobs`, kept here only): a no-grad forward of the policy a pass, apart from the
  update's own.

Printed per mode: passes per step, padded / non-padded tokens, the forwards of one update (the
policy's with and without grad, the reference's: hooks on the models), the median seconds of the
update over --rounds (modes interleaved), and its seconds against the two "before" modes of issue
27; then the old log-probs' line: the packed update's seconds and forwards against the same plan's
with them recomputed (the ratio < 1 is the forward saved). `--compare old-logprobs` runs only those
two modes.

    .venv/bin/python tools/bench/update_phase.py [--prompts 4] [--group 4] [--rounds 3] [--compare all|old-logprobs]
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
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def today_plan(n_rows: int, width: int, capacity: int, micro_batch_size: int) -> list:
    """The passes of the code before issue 27 (trainer._passes with batch.micro_batches): 1 pass of every
    row when micro_batch_size is 0, else ceil(capacity / micro_batch_size) passes of micro_batch_size
    rows in batch order, each row as wide as the batch's longest; a pass past the rank's rows is a filler."""
    from ggpo_batch.train.policy.passes import FILLER, Pass

    if not micro_batch_size:
        return [Pass(tuple(range(n_rows)), width)]
    passes = []
    for j in range(-(-capacity // micro_batch_size)):
        rows = tuple(range(j * micro_batch_size, min(n_rows, (j + 1) * micro_batch_size)))
        passes.append(Pass(rows, width) if rows else FILLER)
    return passes


def recompute_old_logprobs(trainer) -> None:  # type: ignore[no-untyped-def]
    """Give `trainer` the old log-probs of the code before issue 39 (kept here only, for the comparison
    and tests/train/hf/test_old_logprobs.py): with old_logprobs = "policy", a no-grad forward of the
    policy over each pass's rows, apart from the update's own (train/run/trainer.py `_old_logprobs`
    now detaches the update's). That code ran every pass's no-grad forward before the first; here each
    runs just before its pass's own, on the same weights (the optimizer steps after the last pass)."""
    import torch

    live, recomputed = trainer._policy_logprobs, []

    def policy_logprobs(part_ids, part_attn, m):  # type: ignore[no-untyped-def]
        if torch.is_grad_enabled() and trainer.cfg.old_logprobs == "policy":
            with torch.no_grad():
                recomputed.append(live(part_ids, part_attn, m))
        return live(part_ids, part_attn, m)

    trainer._policy_logprobs = policy_logprobs
    trainer._old_logprobs = lambda logp: recomputed.pop() if recomputed else logp.detach()


def count_forwards(trainer) -> Counter:  # type: ignore[no-untyped-def,type-arg]
    """Forwards of the policy (with and without grad) and of the reference from now on, counted by hooks
    on their base models (every log-prob path runs one: train/policy/logprobs.py)."""
    import torch

    counted: Counter = Counter()  # type: ignore[type-arg]

    def hook(name: str):  # type: ignore[no-untyped-def]
        def count(*_):  # type: ignore[no-untyped-def]
            counted[name + (" with grad" if name == "policy" and torch.is_grad_enabled() else "")] += 1
        return count

    trainer.engine.module.base_model.register_forward_pre_hook(hook("policy"))
    trainer.reference.module.base_model.register_forward_pre_hook(hook("reference"))
    return counted


def build(folder: Path, *, answer_mean: float, search_mean: float, hidden: int,
          layers: int) -> tuple[Path, dict[str, Path]]:
    """The tiny checkpoint (`hidden` x `layers`) shaped for multi-turn episodes, and its QA set."""
    from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set, set_turn_lengths

    model = build_checkpoint(folder / "model", hidden=hidden, layers=layers, heads=4, kv_heads=2)
    set_turn_lengths(model, search_share=0.6, search_mean=search_mean, answer_mean=answer_mean)
    return model, build_qa_set(folder / "qa", n_train=64, n_eval=8)


def make_trainer(model: Path, files: dict[str, Path], train: dict, seed: int = 1):  # type: ignore[no-untyped-def,type-arg]
    """A one-rank trainer of the tiny checkpoint (the process group must exist)."""
    import torch

    from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.run.trainer import Trainer

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
    ap.add_argument("--compare", choices=("all", "old-logprobs"), default="all",
                    help="every mode, or only the packed update against its old log-probs recomputed")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # one thread: what a shared machine's load moves least
    import torch
    import torch.distributed as dist

    from ggpo_batch.common.netutil import free_port

    torch.set_num_threads(1)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    from ggpo_batch.train.policy.batch import agreed_plan

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
        packed = f"packed, max_tokens_per_pass={budget}"
        recomputed = f"{packed}, old log-probs recomputed (before issue 39)"

        def packed_plan(attn):  # type: ignore[no-untyped-def]
            return agreed_plan(attn.sum(dim=1).tolist(), budget, 0, torch.device("cpu"))

        # mode -> (its plan of the step's rows, whether the old log-probs are recomputed as before issue 39)
        modes = {
            "before, micro_batch_size=1": (lambda attn: today_plan(len(lengths), width, capacity, 1), False),
            "before, micro_batch_size=0": (lambda attn: today_plan(len(lengths), width, capacity, 0), False),
            packed: (packed_plan, False),
            "packed, micro_batch_size=1": (lambda attn: agreed_plan(
                attn.sum(dim=1).tolist(), budget, 1, torch.device("cpu")), False),
            recomputed: (packed_plan, True),
        }
        if args.compare == "old-logprobs":
            modes = {m: modes[m] for m in (packed, recomputed)}
        trainer._rollouts = lambda groups, step: copy.deepcopy(trajs)
        update, seconds, shape, forwards = trainer._update, {m: [] for m in modes}, {}, {}
        counted = count_forwards(trainer)
        mode_now = [""]

        def timed(batch, row_adv, aux, figures, plan):  # type: ignore[no-untyped-def]
            counted.clear()
            t0 = time.perf_counter()
            update(batch, row_adv, aux, figures, plan)
            seconds[mode_now[0]].append(time.perf_counter() - t0)
            real = int(batch[1].sum())
            shape[mode_now[0]] = (len(plan), sum(p.padded_tokens for p in plan) / real)
            forwards[mode_now[0]] = dict(counted)

        def use(mode: str) -> None:
            mode_now[0] = mode
            trainer._plan, recompute = modes[mode]
            for seam in ("_policy_logprobs", "_old_logprobs"):  # back to the trainer's own
                trainer.__dict__.pop(seam, None)
            if recompute:
                recompute_old_logprobs(trainer)

        trainer._update = timed
        use(packed)
        trainer.step()  # warm-up: the first step's allocations
        seconds[packed].clear()
        for _ in range(args.rounds):
            for mode in modes:
                use(mode)
                trainer.step()
        trainer.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{len(lengths)} rows of one step ({args.prompts} groups x {args.group}, up to {args.turns} turns): "
          f"{min(lengths)}-{width} tokens (median {statistics.median(lengths):.0f}); median of {args.rounds} "
          f"updates per mode, 1 CPU thread")

    def counts(mode: str) -> str:
        f = forwards[mode]
        return (f"forwards: policy {f.get('policy with grad', 0)} with grad + {f.get('policy', 0)} without, "
                f"reference {f.get('reference', 0)}")

    median = {m: statistics.median(seconds[m]) for m in modes}
    for mode in modes:
        n, ratio = shape[mode]
        against = "" if args.compare == "old-logprobs" else (
            f"; vs before mbs=1 {median[mode] / median['before, micro_batch_size=1']:.2f}x, "
            f"vs before mbs=0 {median[mode] / median['before, micro_batch_size=0']:.2f}x")
        print(f"{mode}: {n} passes, padded / non-padded tokens {ratio:.2f}, {counts(mode)}, "
              f"{median[mode]:.2f} s per update{against}")
    after, before = forwards[packed], forwards[recomputed]
    print(f"old log-probs from the update's own forward vs recomputed (before issue 39), same {shape[packed][0]} "
          f"passes: {median[packed]:.2f} vs {median[recomputed]:.2f} s per update, ratio "
          f"{median[packed] / median[recomputed]:.2f}; forwards per update {sum(after.values())} vs "
          f"{sum(before.values())} (policy without grad {after.get('policy', 0)} vs {before.get('policy', 0)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
