"""The training part of tools/gpu/flagship_check.py: the flagship's shapes, the model, and its timed
steps through the trainer's own update (train/run/trainer.py `Trainer._plan` and `_update`), with
the step's FLOPs (tools/gpu/flops.py) from the passes it ran and the forwards it counted.

Stdlib only at import (flagship_check checks the Python and transformers versions before anything
else is imported); torch, transformers, DeepSpeed and the package inside the functions.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections import Counter
from typing import Any

from tools.gpu.flops import Forwards, PassShape, Shape, step_flops

FLAGSHIP_SPEC = "exposure-5arm.toml"  # in ggpo_batch/data/examples/ (a copy of jobs/)
# Qwen3-1.7B's config.json (Qwen/Qwen3-1.7B): 1,720,574,976 parameters with tied embeddings.
QWEN3_1_7B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02}
# The same architecture, small enough for the CPU (head_dim 32 as the tiny checkpoints').
TINY: dict[str, Any] = {
    **QWEN3_1_7B, "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 512}
# --tiny's run: chunks smaller than a pass (several chunks each way, as at 150k vocabulary); a learning
# rate at which the tiny random model moves past bfloat16's noise within a few steps (at the flagship's
# 1e-6 it would not within the run: the probe's calibration, docs/figures.md), so planted defects show;
# a pass budget that holds one 96-token row or several --packed rows of 24-64 tokens.
TINY_RUN = {"steps": 2, "warmup": 1, "passes": 2, "seq_len": 96, "prompt_tokens": 16, "probe_steps": 6,
            "chunk_tokens": 32, "chunk_vocab": 256, "lr": 1e-3, "pass_tokens": 128, "rows": 6, "row_tokens": (24, 64)}
# --packed on the GPU: no measured length distribution of the flagship's rollouts exists yet (a run's
# history has it: passes_padded_tokens); uniform over this range is a stand-in.
ROW_TOKENS = (1024, 8192)


def flagship_spec() -> tuple[Any, int]:
    """The flagship spec's `[train]` table as the trainer reads it (train/config.py), and its GPUs a run."""
    import tomllib

    from ggpo_batch.common.datafiles import EXAMPLES_DIR
    from ggpo_batch.train.config import TrainConfig

    path = EXAMPLES_DIR / FLAGSHIP_SPEC
    table = tomllib.loads(path.read_text())
    return TrainConfig.from_table(table["train"], str(path)), int(table["experiment"]["gpus"])


def start_distributed(cuda: bool) -> Any:
    """One rank (torchrun-style variables), NCCL on the GPU, gloo on the CPU; DeepSpeed imported as the
    trainer imports it (train/policy/deepspeed_import.py)."""
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.policy.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed(cuda)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)
    return deepspeed


def build(shape: dict[str, Any], dtype: Any, device: Any, attn: str, seed: int = 0) -> Any:
    """A Qwen3 causal LM of `shape`, random-initialised on `device` in `dtype` (no download)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    with torch.device(device):  # initialised where it runs: a 1.7B model in seconds, not on the host
        return AutoModelForCausalLM.from_config(Qwen3Config(**shape), dtype=dtype, attn_implementation=attn)


def flop_shape(model: Any) -> Shape:
    """What tools/gpu/flops.py reads of the model: parameters counted from the module itself."""
    c = model.config
    embedding = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) for p in m.parameters()}
    params = list(model.parameters())  # tied weights once
    return Shape(parameters=sum(p.numel() for p in params),
                 body_parameters=sum(p.numel() for p in params if id(p) not in embedding),
                 layers=c.num_hidden_layers, heads=c.num_attention_heads, head_dim=c.head_dim, hidden=c.hidden_size,
                 vocab=c.vocab_size)


def row_lengths(gen: Any, args: argparse.Namespace) -> list[int]:
    """The step's rows: `--passes` rows of `--seq-len` tokens, or `--packed`: `--rows` rows of lengths
    drawn uniformly from `--row-tokens`."""
    import torch

    if not args.packed:
        return [args.seq_len] * args.passes
    lo, hi = args.row_tokens
    return torch.randint(lo, hi + 1, (args.rows,), generator=gen).tolist()


def loss_rows(gen: Any, lengths: list[int], prompt_tokens: int, vocab: int, pad_id: int) -> tuple[Any, ...]:
    """Rows of random tokens collated as the trainer collates a step's (train/policy/batch.collate):
    ids, attention, loss mask (every target after the first `prompt_tokens` tokens), behaviour log-probs."""
    import torch

    from ggpo_batch.train.policy.batch import collate
    from ggpo_batch.train.rollout.environment import GENERATED, PROMPT

    rows = [(torch.randint(0, vocab, (n,), generator=gen).tolist(),
             [PROMPT] * prompt_tokens + [GENERATED] * (n - prompt_tokens), [0.0] * n) for n in lengths]
    ids, attn, src, blp = collate(rows, pad_id)
    return ids, attn, src[:, 1:] == GENERATED, blp


def _trainer_class() -> type:
    from ggpo_batch.train.run.trainer import Trainer

    class StepTrainer(Trainer):
        """The Trainer's own `_plan` and `_update` (packing to the pass budget, the step's gradient
        accumulation set to its passes, DeepSpeed's boundary at the last, the reference's refresh every
        reference_refresh_steps) on rows made here: a Trainer without data, curriculum, retriever or
        rollout backend, so its __init__ (which loads them) is not run; what the two methods read is set."""

        def __init__(self, **attributes: Any) -> None:  # no super().__init__: see above
            self.__dict__.update(attributes)

    return StepTrainer


class Run:
    """The policy engine, its reference and the step they train with (flagship_check's part 1)."""

    def __init__(self, args: argparse.Namespace, cfg: Any, gpus: int, shape: dict[str, Any], device: Any,
                 codec: Any, deepspeed: Any) -> None:
        import torch

        from ggpo_batch.contracts.runspec import ArmSpec, RunSpec
        from ggpo_batch.train.audit.checkpoint import LoopState
        from ggpo_batch.train.policy.engine_config import policy_engine_config
        from ggpo_batch.train.policy.logprobs import Chunks
        from ggpo_batch.train.policy.passes import token_budget
        from ggpo_batch.train.policy.reference import Reference
        from ggpo_batch.train.pretrained.hf import training_mode

        self.args, self.shape, self.device, self.codec = args, shape, device, codec
        self.cuda = device.type == "cuda"
        self.dtype = getattr(torch, cfg.model.dtype)
        self.cfg, self.lr = cfg, args.lr or (TINY_RUN["lr"] if args.tiny else cfg.lr)
        self.chunks = (Chunks(TINY_RUN["chunk_tokens"], TINY_RUN["chunk_vocab"]) if args.tiny else
                       Chunks(cfg.logprob_chunk_tokens, cfg.logprob_chunk_vocab))
        # The pass budget of a rank of the flagship's run (its `gpus` ranks; --tiny: a small one).
        self.budget = TINY_RUN["pass_tokens"] if args.tiny else token_budget(cfg, gpus)
        bf16, fp16 = self.dtype == torch.bfloat16, self.dtype == torch.float16
        model = training_mode(build(shape, self.dtype, device, cfg.model.attn_implementation),
                              cfg.model.gradient_checkpointing)
        self.architecture = type(model).__name__
        self.flop_shape = flop_shape(model)
        self.parameters = self.flop_shape.parameters
        reference = Reference(copy.deepcopy(model), zero_stage=cfg.zero_stage, device=device, bf16=bf16, fp16=fp16)
        # As Trainer.__init__ builds it: one pass, each step sets its own accumulation (`_update`).
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=policy_engine_config(
            model, zero_stage=cfg.zero_stage, passes=1, grad_clip=cfg.grad_clip, lr=self.lr, bf16=bf16, fp16=fp16,
            gpu=self.cuda))
        spec = RunSpec(run_key="flagship-check", experiment="flagship-check", experiment_version=1, method="ggpo",
                       arm=ArmSpec("clean"), seed=0, gpus=1, loop_budget_seconds=0.0, executor="local",
                       profile="default")
        self.trainer = _trainer_class()(
            spec=spec, cfg=cfg, gcfg=cfg.ggpo, rank=0, world=1, device=device, codec=codec, chunks=self.chunks,
            engine=engine, reference=reference, token_budget=self.budget, state=LoopState())
        self.engine, self.reference = engine, reference
        self.gen = torch.Generator().manual_seed(0)
        self.forwards: Counter = Counter()
        for name, module in (("policy", engine.module.base_model), ("reference", reference.module.base_model)):
            module.register_forward_pre_hook(lambda *_, name=name: self._count(name))

    def _count(self, name: str) -> None:
        import torch

        self.forwards[name + ("_grad" if name == "policy" and torch.is_grad_enabled() else "")] += 1

    def synchronize(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def step(self) -> dict[str, Any]:
        """One update on fresh random rows, through the trainer's plan and update: its loss, seconds, the
        passes it ran (tools/gpu/flops.PassShape), the forwards it counted and their FLOPs."""
        import torch

        from ggpo_batch.train.policy.ggpo import group_advantages
        from ggpo_batch.train.policy.step_figures import StepFigures

        a, t = self.args, self.trainer
        lengths = row_lengths(self.gen, a)
        batch = loss_rows(self.gen, lengths, a.prompt_tokens, self.shape["vocab_size"], self.codec.pad_id)
        rewards = torch.rand((1, len(lengths)), generator=self.gen)  # one group: the step's rows
        adv = group_advantages(rewards, self.cfg.ggpo.advantage_eps).advantages.flatten().tolist()
        plan = t._plan(batch[1])
        figures = StepFigures()
        self.forwards.clear()
        self.synchronize()
        t0 = time.perf_counter()
        t._update(batch, adv, [], figures, plan)
        self.synchronize()
        seconds = time.perf_counter() - t0
        t.state.step += 1
        mask = batch[2]
        passes = [PassShape(tuple(lengths[i] for i in p.rows), p.width, int(mask[list(p.rows), : p.width - 1].sum()))
                  for p in plan]
        counted = {k: self.forwards[k] for k in ("policy_grad", "policy", "reference")}
        if any(v % len(plan) for v in counted.values()) or counted["policy_grad"] != len(plan):
            raise RuntimeError(f"forwards {counted} are not one set a pass over {len(plan)} passes")
        forwards = Forwards(old_logprobs=counted["policy"] // len(plan), reference=counted["reference"] // len(plan),
                            checkpointing=bool(self.engine.module.is_gradient_checkpointing),
                            chunked_head=self.chunks.tokens > 0)
        model, executed = step_flops(self.flop_shape, passes, forwards)
        return {"loss": figures.loss, "seconds": seconds, "passes": passes, "forwards": forwards,
                "model_flops": model, "executed_flops": executed}


def training_figures(run: Run, peak: float | None, peak_source: str | None) -> dict[str, Any]:
    """Part 1's timed steps (peak memory counted from the first of them): tokens/s, MFU and the step's
    FLOP utilisation (tools/gpu/flops.py)."""
    import dataclasses

    import torch

    a, m = run.args, run.engine.module
    steps = []
    for i in range(a.warmup + a.steps):
        if run.cuda and i == a.warmup:
            torch.cuda.reset_peak_memory_stats(run.device)
        steps.append(run.step())
    timed = steps[a.warmup:]
    seconds = sum(s["seconds"] for s in timed)
    tokens = sum(n for s in timed for p in s["passes"] for n in p.lengths)
    padded = sum(len(p.lengths) * p.width for s in timed for p in s["passes"])
    model = sum(s["model_flops"] for s in timed)
    executed = sum(s["executed_flops"] for s in timed)
    tflops, executed_tflops = model / seconds / 1e12, executed / seconds / 1e12
    return {"zero_stage": run.cfg.zero_stage, "ranks": 1, "lr": run.lr, "dtype": run.cfg.model.dtype,
            # As the module holds them, not as asked: what the timed steps ran with.
            "gradient_checkpointing": bool(m.is_gradient_checkpointing),
            "attn_implementation": m.config._attn_implementation, "old_logprobs": run.cfg.old_logprobs,
            "packed": a.packed, "pass_token_budget": run.budget, "prompt_tokens": a.prompt_tokens,
            "chunks": {"tokens": run.chunks.tokens, "vocab": run.chunks.vocab}, "warmup_steps": a.warmup,
            "timed_steps": a.steps, "step_seconds": [s["seconds"] for s in steps], "loss": [s["loss"] for s in steps],
            "steps": [{"passes": [dataclasses.asdict(p) for p in s["passes"]],
                       "forwards_per_pass": dataclasses.asdict(s["forwards"]), "model_flops": s["model_flops"],
                       "executed_flops": s["executed_flops"]} for s in steps],
            "tokens": tokens, "padded_tokens": padded, "tokens_per_second": tokens / seconds,
            "model_flops": model, "executed_flops": executed, "model_tflops": tflops,
            "executed_tflops": executed_tflops, "peak_tflops": peak, "peak_source": peak_source,
            "mfu": tflops / peak if peak else None, "flop_utilisation": executed_tflops / peak if peak else None}
