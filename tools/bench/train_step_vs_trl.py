"""Seconds per training step on the CPU: our ggpo trainer vs TRL's GRPOTrainer, measured in one run.

Both train the same tiny Hugging Face checkpoint (a Qwen2-architecture model with a BPE tokenizer and
a ChatML chat template, built offline by ggpo_batch/train/task/tiny_hf.py) on the same two-hop QA items
([train.data] JSONL), with the same prompt (the chat template around the tool instructions and the
question), verifier reward, group size, prompts per step, completion length, temperature, learning
rate, clip range and KL coefficient (TRL's loss_type="bnpo", the ggpo loss; see
tests/train/hf/test_hf_trl_loss.py). Single-turn for both (TRL's GRPO runs no search tool here), one
process, the same torch thread count. Ours is the whole step (rollouts through the torch sampler,
reference and policy passes, DeepSpeed ZeRO-2 update, weight push to the behaviour copy); TRL's is
the time between its step-end callbacks (generation with HF generate, reference pass, update).
Prints per-step medians and the ratio ours/TRL (goal: at most 0.8).

    .venv/bin/python tools/bench/train_step_vs_trl.py [--steps 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch

from ggpo_batch.common.netutil import free_port
from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.task.codec import ANSWER_CLOSE, ANSWER_OPEN, instruction
from ggpo_batch.train.task.qa import TEMPLATES, Item, read_items, score
from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set

PROMPTS, G, NEW_TOKENS, LR, CLIP, KL, TEMPERATURE = 4, 4, 24, 1e-3, 0.2, 0.02, 1.0


def answer_of(text: str) -> str:
    """The answer in a completion's text (HfCodec.answer_text on text): inside the tags, else all of it."""
    start = text.find(ANSWER_OPEN)
    if start < 0:
        return text.strip()
    end = text.find(ANSWER_CLOSE, start)
    return text[start + len(ANSWER_OPEN): end if end >= 0 else len(text)].strip()


def config(model: Path, data: dict[str, Path]) -> TrainConfig:
    # max_turns=1: TRL's GRPO is single-turn here; reference refresh off the hot path, like TRL's default.
    return TrainConfig.from_table({
        "model": {"path": str(model), "dtype": "float32", "max_model_len": 1024},
        "data": {k: str(v) for k, v in data.items()},
        "max_turns": 1, "max_new_tokens": NEW_TOKENS, "prompts_per_step": PROMPTS, "group_size": G, "lr": LR,
        "clip_epsilon": CLIP, "kl_coef": KL, "temperature": TEMPERATURE, "reference_refresh_steps": 10**6,
    }, "bench")


def time_ours(cfg: TrainConfig, steps: int, warmup: int) -> tuple[list[float], list[float]]:
    import deepspeed

    from ggpo_batch.train.run.trainer import Trainer

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    spec = RunSpec(run_key="0/clean", experiment="bench", experiment_version=1, method="ggpo", arm=ArmSpec("clean"),
                   seed=0, gpus=1, loop_budget_seconds=1e9, executor="local", profile="default", train=cfg.to_table())
    tr = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    wall, cpu = [], []
    for i in range(warmup + steps):
        w, c = time.perf_counter(), time.process_time()
        tr.step()
        if i >= warmup:
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
    tr.close()
    torch.distributed.destroy_process_group()
    return wall, cpu


def time_trl(model: Path, items: tuple[Item, ...], steps: int, warmup: int) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    by_id = {it.item_id: it for it in items}
    # The same user message our codec renders through the chat template (HfCodec.chat_prompt).
    rows = [{"prompt": [{"role": "user", "content": f"{instruction()}\n\n{TEMPLATES['train'].format(question=it.question)}"}],
             "item_id": it.item_id} for it in items]
    ds = Dataset.from_list(rows * 20)

    def verifier(completions, item_id, **_):  # type: ignore[no-untyped-def]
        return [score(answer_of(c[0]["content"]), by_id[i]) for c, i in zip(completions, item_id)]

    marks: list[tuple[float, float]] = []
    threads = torch.get_num_threads()

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            torch.set_num_threads(threads)  # accelerate sets its own count on the CPU; both sides use ours
            marks.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            marks.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, report_to="none", max_steps=warmup + steps, logging_steps=10**6,
            save_strategy="no", per_device_train_batch_size=PROMPTS * G, gradient_accumulation_steps=1,
            num_generations=G, max_completion_length=NEW_TOKENS, temperature=TEMPERATURE, learning_rate=LR,
            beta=KL, epsilon=CLIP, loss_type="bnpo", use_bias_correction_kl=False, max_grad_norm=1.0, seed=0,
            dataloader_num_workers=0, disable_tqdm=True, use_vllm=False,
        )
        trainer = GRPOTrainer(model=str(model), reward_funcs=verifier, args=args, train_dataset=ds,
                              processing_class=AutoTokenizer.from_pretrained(model), callbacks=[Clock()])
        trainer.train()
    assert torch.get_num_threads() == threads
    wall = [b[0] - a[0] for a, b in itertools.pairwise(marks)][warmup:]
    cpu = [b[1] - a[1] for a, b in itertools.pairwise(marks)][warmup:]
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for both (1: CPU seconds count work, not OpenMP spin-waits on a busy machine)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_checkpoint(Path(tmp) / "model")
        data = build_qa_set(Path(tmp) / "qa")
        cfg = config(model, data)
        print(f"tiny Qwen2 checkpoint ({sum(1 for _ in model.iterdir())} files), torch threads "
              f"{torch.get_num_threads()}; {PROMPTS} prompts x G={G}, {NEW_TOKENS} new tokens, {a.steps} timed "
              f"steps after {a.warmup} warm-up")
        ours_w, ours_c = time_ours(cfg, a.steps, a.warmup)
        trl_w, trl_c = time_trl(model, read_items(str(data["train"]), "train"), a.steps, a.warmup)
    med = statistics.median
    print(f"ours (ggpo, DeepSpeed ZeRO-2, torch KV sampler): {med(ours_c):.4f} CPU s/step, {med(ours_w):.4f} wall s/step")
    print(f"TRL {__import__('trl').__version__} GRPOTrainer (bnpo):         {med(trl_c):.4f} CPU s/step, "
          f"{med(trl_w):.4f} wall s/step")
    print(f"ratio ours/TRL (median CPU s per step): {med(ours_c) / med(trl_c):.3f}   "
          f"(wall: {med(ours_w) / med(trl_w):.3f}; goal <= 0.8)")


if __name__ == "__main__":
    main()
