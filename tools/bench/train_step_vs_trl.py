"""CPU seconds per training step: our ggpo trainer vs TRL's GRPOTrainer, measured in the same run.

Same tiny GPT-2 (built from config, byte vocabulary), same synthetic questions and verifier
reward, same group size, prompts per step, completion length and learning rate. Single-turn for
both (TRL's GRPO has no search tool here), one process, the same torch thread count. Prints the
per-step figures and the ratio ours/TRL (below 1.0 = ours is faster).

    PYTHONPATH=$PWD python tools/bench/train_step_vs_trl.py [--steps 8] [--warmup 2]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch

from ggpo_batch.runspec import ArmSpec, RunSpec
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.model import build_model
from ggpo_batch.train.task import TEMPLATES, reward, synthetic
from ggpo_batch.train.tokenizer import DOC_CLOSE, DOC_OPEN, EOS, SEARCH


def byte_tokenizer():
    """An HF fast tokenizer whose ids equal our byte vocabulary (GPT-2's byte-to-unicode map, no merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    fast.add_special_tokens({"additional_special_tokens": ["<search>", "<doc>", "</doc>"]})
    assert fast.convert_tokens_to_ids(["<eos>", "<search>", "<doc>", "</doc>"]) == [EOS, SEARCH, DOC_OPEN, DOC_CLOSE]
    return fast


def time_ours(cfg: TrainConfig, steps: int, warmup: int) -> tuple[list[float], list[float]]:
    import deepspeed

    from ggpo_batch.train.trainer import Trainer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
    return wall, cpu


def time_trl(cfg: TrainConfig, steps: int, warmup: int) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = synthetic(cfg)
    rows = [{"prompt": TEMPLATES["train"].format(question=i.question), "gold": i.answer} for i in data.train]
    ds = Dataset.from_list(rows * 50)

    def verifier(completions, gold, **_):
        return [reward(c, g) for c, g in zip(completions, gold)]

    marks: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            marks.append((time.perf_counter(), time.process_time()))

        def on_train_begin(self, args, state, control, **kw):
            marks.append((time.perf_counter(), time.process_time()))

    n = cfg.prompts_per_step * cfg.group_size
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, report_to="none", max_steps=warmup + steps, logging_steps=10**6,
            save_strategy="no", per_device_train_batch_size=n, gradient_accumulation_steps=1,
            num_generations=cfg.group_size, max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature,
            learning_rate=cfg.lr, beta=cfg.kl_coef, epsilon=cfg.clip_epsilon, max_grad_norm=cfg.grad_clip,
            seed=0, dataloader_num_workers=0, disable_tqdm=True,
        )
        # A path, not an instance: TRL loads its reference model from the same path (beta > 0).
        build_model(cfg, 0).save_pretrained(f"{out}/init")
        trainer = GRPOTrainer(model=f"{out}/init", reward_funcs=verifier, args=args, train_dataset=ds,
                              processing_class=byte_tokenizer(), callbacks=[Clock()])
        trainer.train()
    wall = [b[0] - a[0] for a, b in zip(marks, marks[1:])][warmup:]
    cpu = [b[1] - a[1] for a, b in zip(marks, marks[1:])][warmup:]
    return wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    # max_turns=1: TRL's GRPO here is single-turn; reference refresh off the hot path like TRL's default.
    cfg = TrainConfig(max_turns=1, max_new_tokens=16, prompts_per_step=4, group_size=4, reference_refresh_steps=10**6)
    print(f"torch threads {torch.get_num_threads()}; {cfg.prompts_per_step} prompts x G={cfg.group_size}, "
          f"{cfg.max_new_tokens} new tokens, {a.steps} timed steps after {a.warmup} warm-up")
    ours_w, ours_c = time_ours(cfg, a.steps, a.warmup)
    trl_w, trl_c = time_trl(cfg, a.steps, a.warmup)
    med = statistics.median
    print(f"ours (ggpo, DeepSpeed ZeRO-2, torch KV sampler): {med(ours_c):.4f} CPU s/step, {med(ours_w):.4f} wall s/step")
    print(f"TRL {__import__('trl').__version__} GRPOTrainer:               {med(trl_c):.4f} CPU s/step, "
          f"{med(trl_w):.4f} wall s/step")
    print(f"ratio ours/TRL (median CPU s per step): {med(ours_c) / med(trl_c):.3f}   "
          f"(wall: {med(ours_w) / med(trl_w):.3f})")


if __name__ == "__main__":
    main()
