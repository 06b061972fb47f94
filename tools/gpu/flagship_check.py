"""The one-shot GPU check of the flagship run (jobs/exposure-5arm.toml) on one lent GPU, in minutes.

For a machine with torch, transformers and a carried DeepSpeed wheel only (tools/gpu/README.md): no
vLLM, no download. A Qwen3-1.7B-shaped model (its config.json's shape, `QWEN3_1_7B`) is built from
config in bfloat16, random-initialised, and trained as the trainer trains it, with the flagship
spec's `[train]` settings (learning rate, ZeRO stage 2, gradient checkpointing, log-prob chunks,
ggpo loss, max_model_len) read from the packaged example spec, on one rank (world size 1). What it
reuses from the package, so that it checks the package and not a copy: the DeepSpeed config
(train/engine_config.py), checkpointing (hf.training_mode), the chunked log-probs
(train/logprobs.py), the reference (train/reference.py), the loss (train/ggpo.py), the weight push
and its probe (train/weight_sync.py, train/probe.py), the memory formula (gpu_memory.py) and the
chat-template check (train/chat_template.py).

Four parts, each printed:

1. Training: `--steps` timed steps (after `--warmup`), each `--passes` forward/backward passes of
   one `--seq-len`-token row (the flagship's micro_batch_size 1), the trainer's order: the policy's
   old log-probs (no grad), then per pass the policy's log-probs with grad, the reference's, the
   ggpo loss and DeepSpeed's backward and step. MFU = 6 * N * tokens / seconds / peak, N = all
   parameters (tied embeddings once), tokens = the rows' tokens, seconds = the timed steps' wall
   time, peak = `--peak-tflops` (H200 dense bf16, 989 TFLOP/s). 6N counts the policy's forward and
   backward only (not checkpointing's recomputed forward, the old log-probs' or the reference's
   forward, nor attention's T^2 work): the usual model-FLOPs convention, a lower bound of the work.
2. Memory: torch.cuda.max_memory_allocated over the training steps beside gpu_memory.py's estimate
   for the same shape (one rank, ZeRO-2, these rows and tokens, torch rollouts: no vLLM reservation).
   Its tensor terms (all but cuda_context, nccl and allocator_slack) must cover the measured peak
   (check `memory`); the device's used memory (mem_get_info) is shown beside the estimate's total.
3. Probe: an eager-attention copy of the same weights is the rollout backend; after every update of
   `--probe-steps` more steps the policy's weights are pushed into it and probed (WeightSync, the
   trainer's own), SDPA against eager on real kernels: every probe must pass (check `probe`). Copies
   with each planted defect of tools/bench/probe_calibration.py (a skipped layer, gate/up swapped, an
   fp8 cast, pushes that stop) are probed beside it, as figures: which the criterion caught, when.
   `--plant-probe DEFECT` gives the checked backend that defect (the check must then fail).
4. Template: the Qwen3-style thinking template (tiny_hf.THINKING_CHAT_TEMPLATE) over a tokenizer built
   offline, checked by train/chat_template.check as preflight checks it: it must refuse the
   template's default and pass with the flagship spec's `chat_template_kwargs` (enable_thinking =
   false) (check `template`). `--plant-template` checks a thinking-only template instead (no switch).

Exit 0 when every check passed, 1 when one failed, 2 for bad arguments or a module that cannot be
imported. `--tiny` runs a small Qwen3-shaped config on the CPU (gloo, bfloat16, about 20 seconds):
what tests/train/test_gpu_script.py runs. `--json` prints one JSON object (`--json-file` writes it too).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

H200_BF16_DENSE_TFLOPS = 989.0
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
# 1e-6 it would not within the run: the probe's calibration, docs/figures.md), so planted defects show.
TINY_RUN = {"steps": 2, "warmup": 1, "passes": 2, "seq_len": 96, "prompt_tokens": 16, "probe_steps": 6,
            "chunk_tokens": 32, "chunk_vocab": 256, "lr": 1e-3}
STOP_AFTER = 3  # the planted stopped push stops after this many pushes
NEEDED = ("torch", "transformers", "deepspeed", "jinja2", "tokenizers")
NON_TENSOR_TERMS = ("cuda_context", "nccl", "allocator_slack")  # gpu_memory terms max_memory_allocated omits
GIB = 1 << 30


def parse(argv: list[str] | None) -> argparse.Namespace:
    from tools.bench.probe_calibration import DEFECTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a small config on the CPU (what the suite runs)")
    ap.add_argument("--steps", type=int, help="timed training steps (default 4; --tiny 2)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default 1)")
    ap.add_argument("--passes", type=int, help="forward/backward passes a step, one row each (default 4; --tiny 2)")
    ap.add_argument("--seq-len", type=int, help="tokens a row (default the flagship's max_model_len; --tiny 96)")
    ap.add_argument("--prompt-tokens", type=int, help="tokens of a row outside the loss (default 512; --tiny 16)")
    ap.add_argument("--probe-steps", type=int, help="steps with a weight push and probe after each (default 30)")
    ap.add_argument("--lr", type=float, help="learning rate (default the flagship spec's; --tiny 1e-3)")
    ap.add_argument("--peak-tflops", type=float,
                    help=f"the device's dense bf16 peak for MFU (default {H200_BF16_DENSE_TFLOPS:g} on a GPU, H200; "
                         f"none on the CPU)")
    ap.add_argument("--plant-probe", choices=DEFECTS, help="give the checked rollout backend this defect")
    ap.add_argument("--plant-template", action="store_true", help="check a thinking-only template (no switch)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--json-file", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    defaults = TINY_RUN if args.tiny else {"steps": 4, "warmup": 1, "passes": 4, "seq_len": None,
                                           "prompt_tokens": 512, "probe_steps": 30}
    for key in ("steps", "warmup", "passes", "seq_len", "prompt_tokens", "probe_steps"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.steps < 1 or args.warmup < 0 or args.passes < 1 or args.probe_steps < STOP_AFTER + 1:
        ap.error(f"--steps >= 1, --warmup >= 0, --passes >= 1, --probe-steps >= {STOP_AFTER + 1}")
    args.seq_len = args.seq_len or flagship_config().model.max_model_len
    if not 2 <= args.prompt_tokens < args.seq_len:
        ap.error("--prompt-tokens must be at least 2 and less than --seq-len")
    if args.lr is not None and args.lr <= 0 or args.peak_tflops is not None and args.peak_tflops <= 0:
        ap.error("--lr and --peak-tflops must be positive")
    return args


def missing_modules() -> list[str]:
    import importlib.util

    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def flagship_config() -> Any:
    """The flagship spec's `[train]` table as the trainer reads it (train/config.py)."""
    from ggpo_batch.datafiles import EXAMPLES_DIR
    from ggpo_batch.train.config import TrainConfig

    path = EXAMPLES_DIR / FLAGSHIP_SPEC
    return TrainConfig.from_table(tomllib.loads(path.read_text())["train"], str(path))


def start_distributed(cuda: bool) -> Any:
    """One rank (torchrun-style variables), NCCL on the GPU, gloo on the CPU; DeepSpeed imported as the
    trainer imports it (train/deepspeed_import.py)."""
    from ggpo_batch.netutil import free_port
    from ggpo_batch.train.deepspeed_import import import_deepspeed

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


def rows(gen: Any, n: int, seq_len: int, prompt_tokens: int, vocab: int, device: Any) -> tuple[Any, Any, Any]:
    """`n` rows of `seq_len` random tokens: ids, attention mask, loss mask (every target after the prompt)."""
    import torch

    ids = torch.randint(0, vocab, (n, seq_len), generator=gen)
    mask = torch.zeros((n, seq_len - 1), dtype=torch.bool)
    mask[:, prompt_tokens - 1:] = True
    return ids.to(device), torch.ones_like(ids).to(device), mask.to(device)


def train_step(engine: Any, reference: Any, passes: list[tuple[Any, Any, Any]], advantages: Any, cfg: Any,
               codec: Any, chunks: Any) -> float:
    """One optimizer update over `passes`, in the trainer's order (Trainer._update, old_logprobs =
    "policy"): old log-probs without grad, then per pass the policy's and the reference's chunked
    log-probs, the ggpo loss weighted by the pass's share of the tokens, backward, step. Returns the loss."""
    import torch

    from ggpo_batch.train.ggpo import ggpo_loss
    from ggpo_batch.train.logprobs import masked_logprobs

    def logprobs(call: Any, module: Any, ids: Any, attn: Any, m: Any) -> Any:
        return masked_logprobs(call, module, ids, attn, m, cfg.temperature, codec, chunks)

    total = sum(int(m.sum()) for _, _, m in passes)
    with torch.no_grad():
        old = [logprobs(engine, engine.module, *p) for p in passes]
    loss = 0.0
    for j, (ids, attn, m) in enumerate(passes):
        logp = logprobs(engine, engine.module, ids, attn, m)
        with torch.no_grad():
            ref = logprobs(reference.call, reference.module, ids, attn, m)
        part, _ = ggpo_loss(logp, old[j], ref, advantages[j:j + 1], m, cfg.ggpo)
        part = part * (m.sum() / total)
        engine.backward(part, scale_wrt_gas=False)
        engine.step()
        loss += float(part.detach())
    return loss


def memory_figures(cfg: Any, model: Any, shape: dict[str, Any], args: argparse.Namespace, chunks: Any,
                   device: Any) -> dict[str, Any]:
    """gpu_memory.py's estimate for this shape and run (GiB by term), beside what CUDA measured."""
    import torch

    from ggpo_batch.gpu_memory import memory_estimate

    cuda = device.type == "cuda"
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory if cuda else 0
    parts = memory_estimate(
        parameters=sum(p.numel() for p in model.parameters()), dtype_bytes=model.dtype.itemsize, ranks=1,
        zero_stage=cfg.zero_stage, rows=1, seq_len=args.seq_len, hidden=shape["hidden_size"],
        layers=shape["num_hidden_layers"], vocab=shape["vocab_size"],
        gradient_checkpointing=bool(model.is_gradient_checkpointing),
        rollout="torch", vllm_fraction=0.0, gpu_bytes=gpu_bytes, chunk_tokens=chunks.tokens,
        chunk_vocab=chunks.vocab)
    tensors = parts["total"] - sum(parts[k] for k in NON_TENSOR_TERMS)
    out: dict[str, Any] = {"estimate_gib": {k: v / GIB for k, v in parts.items()}, "estimate_tensors_gib": tensors / GIB,
                           "max_allocated_gib": None, "max_reserved_gib": None, "device_used_gib": None,
                           "device_total_gib": gpu_bytes / GIB if cuda else None, "within_estimate": None}
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device)
        out.update(max_allocated_gib=peak / GIB, max_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB,
                   device_used_gib=(total - free) / GIB, within_estimate=peak <= tensors)
    return out


def probe_backends(policy: Any, shape: dict[str, Any], dtype: Any, device: Any, codec: Any,
                   planted: str | None) -> dict[str, Any]:
    """name -> rollout backend, each an eager-attention copy of the policy's weights: "checked" (with
    `planted`'s defect when given), then one per planted defect (figures)."""
    from ggpo_batch.train.rollout import TorchSampler
    from tools.bench.probe_calibration import DEFECTS, Planted

    def copy_of() -> Any:
        model = build(shape, dtype, device, "eager")
        model.load_state_dict(policy.state_dict())
        return TorchSampler(model.requires_grad_(False).eval(), codec)

    checked = copy_of()
    out = {"checked": Planted(checked, planted, STOP_AFTER) if planted else checked}
    out.update({d: Planted(copy_of(), d, STOP_AFTER) for d in DEFECTS})
    return out


def template_check(cfg: Any, plant: bool, folder: Path) -> tuple[dict[str, Any], Any]:
    """train/chat_template.check of a Qwen3-style template with the default keywords and with the
    flagship spec's; returns the figures and the codec with the flagship's keywords (the run's: its
    template aside, what the training and the probe read of it is that no token is environment-only)."""
    from ggpo_batch.train import chat_template, tiny_hf
    from ggpo_batch.train.codec import HfCodec

    source = tiny_hf.ALWAYS_THINKING_CHAT_TEMPLATE if plant else tiny_hf.THINKING_CHAT_TEMPLATE
    tokenizer = tiny_hf.build_tokenizer(folder, ["Where was the founder of Kazo born?"], 300, source)
    out: dict[str, Any] = {"template": "thinking-only (planted)" if plant else "Qwen3-style thinking switch"}
    codec = None
    for case, kwargs in (("default", {}), ("flagship", dict(cfg.model.chat_template_kwargs))):
        codec = HfCodec(tokenizer, max_model_len=cfg.model.max_model_len, chat_template_kwargs=kwargs)
        result = chat_template.check(tokenizer.get_chat_template(), kwargs,
                                     lambda q, codec=codec: codec.chat_text(codec.user_message(q)))
        out[case] = {"kwargs": kwargs, "problems": result.problems,
                     "prompt_end": codec.chat_text(codec.user_message("?"))[-40:] if result.renders else None}
    out["passed"] = bool(out["default"]["problems"]) and not out["flagship"]["problems"]
    return out, codec


def progress(t0: float, message: str) -> None:
    """A line on stderr as each part ends: what a run killed at its time limit still shows."""
    print(f"[flagship_check {time.perf_counter() - t0:6.1f} s] {message}", file=sys.stderr, flush=True)


class Run:
    """The policy engine, its reference and the step they train with (the module docstring's part 1)."""

    def __init__(self, args: argparse.Namespace, cfg: Any, shape: dict[str, Any], device: Any, codec: Any,
                 deepspeed: Any) -> None:
        import torch

        from ggpo_batch.train.engine_config import policy_engine_config
        from ggpo_batch.train.hf import training_mode
        from ggpo_batch.train.logprobs import Chunks
        from ggpo_batch.train.reference import Reference

        self.args, self.cfg, self.shape, self.device, self.codec = args, cfg, shape, device, codec
        self.cuda = device.type == "cuda"
        self.dtype = getattr(torch, cfg.model.dtype)
        self.lr = args.lr or (TINY_RUN["lr"] if args.tiny else cfg.lr)
        self.chunks = (Chunks(TINY_RUN["chunk_tokens"], TINY_RUN["chunk_vocab"]) if args.tiny else
                       Chunks(cfg.logprob_chunk_tokens, cfg.logprob_chunk_vocab))
        bf16, fp16 = self.dtype == torch.bfloat16, self.dtype == torch.float16
        model = training_mode(build(shape, self.dtype, device, cfg.model.attn_implementation),
                              cfg.model.gradient_checkpointing)
        self.architecture = type(model).__name__
        self.parameters = sum(p.numel() for p in model.parameters())
        self.reference = Reference(copy.deepcopy(model), zero_stage=cfg.zero_stage, device=device, bf16=bf16,
                                   fp16=fp16)
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=policy_engine_config(
                                                   model, zero_stage=cfg.zero_stage, passes=args.passes,
                                                   grad_clip=cfg.grad_clip, lr=self.lr, bf16=bf16, fp16=fp16,
                                                   gpu=device.type == "cuda"))
        self.gen = torch.Generator().manual_seed(0)

    def synchronize(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.device)

    def step(self) -> tuple[float, float]:
        """One update on fresh random rows: (loss, seconds)."""
        import torch

        from ggpo_batch.train.ggpo import group_advantages

        a = self.args
        passes = [rows(self.gen, 1, a.seq_len, a.prompt_tokens, self.shape["vocab_size"], self.device)
                  for _ in range(a.passes)]
        rewards = torch.rand((1, a.passes), generator=self.gen)  # one group: the passes' rows
        adv = group_advantages(rewards, self.cfg.ggpo.advantage_eps).advantages.flatten().to(self.device)
        self.synchronize()
        t0 = time.perf_counter()
        loss = train_step(self.engine, self.reference, passes, adv, self.cfg, self.codec, self.chunks)
        self.synchronize()
        return loss, time.perf_counter() - t0


def training_figures(run: Run, peak: float | None) -> dict[str, Any]:
    """Parts 1-2's timed steps (peak memory counted from the first of them)."""
    import torch

    a, m = run.args, run.engine.module
    losses, seconds = [], []
    for i in range(a.warmup + a.steps):
        if run.cuda and i == a.warmup:
            torch.cuda.reset_peak_memory_stats(run.device)
        loss, s = run.step()
        losses.append(loss)
        seconds.append(s)
    timed = sum(seconds[a.warmup:])
    tokens = a.steps * a.passes * a.seq_len
    tflops = 6 * run.parameters * tokens / timed / 1e12
    return {"zero_stage": run.cfg.zero_stage, "ranks": 1, "lr": run.lr, "dtype": run.cfg.model.dtype,
            # As the module holds them, not as asked: what the timed steps ran with.
            "gradient_checkpointing": bool(m.is_gradient_checkpointing),
            "attn_implementation": m.config._attn_implementation, "passes_per_step": a.passes, "rows_per_pass": 1,
            "seq_len": a.seq_len, "loss_tokens_per_pass": a.seq_len - a.prompt_tokens,
            "chunks": {"tokens": run.chunks.tokens, "vocab": run.chunks.vocab}, "warmup_steps": a.warmup,
            "timed_steps": a.steps, "step_seconds": seconds, "loss": losses, "tokens_per_second": tokens / timed,
            "model_tflops": tflops, "peak_tflops": peak, "mfu": tflops / peak if peak else None}


def probe_figures(run: Run, t0: float) -> tuple[dict[str, Any], bool]:
    """Part 3: `--probe-steps` updates, each followed by a push into every eager copy and its probe
    (WeightSync's load, then its probe; the load timed to its end on the GPU). Returns the figures
    and whether the checked backend's probes all passed."""
    import torch

    from ggpo_batch.train.probe import PROBE_TOKENS, merged_details
    from ggpo_batch.train.weight_sync import WeightSync

    a, cfg, module = run.args, run.cfg, run.engine.module
    tokens = torch.randint(0, run.shape["vocab_size"], (PROBE_TOKENS,), generator=run.gen).tolist()
    backends = probe_backends(module, run.shape, run.dtype, run.device, run.codec, a.plant_probe)
    # The planted defects' probes fail by design: their lines are the report's, not error logs.
    logging.getLogger("ggpo_batch.train.weight_sync").setLevel(logging.CRITICAL)
    syncs = {name: WeightSync(module, cfg.zero_stage, b, tokens, cfg.model.dtype, run.device)
             for name, b in backends.items()}
    push_seconds = []
    for i in range(a.probe_steps):
        run.step()
        for name, sync in syncs.items():
            start = time.perf_counter()
            sync.load()
            run.synchronize()
            if name == "checked":
                push_seconds.append(time.perf_counter() - start)
            sync.probe(i)
        if (i + 1) % 10 == 0:
            progress(t0, f"probe: {i + 1} of {a.probe_steps} steps, checked backend's failures so far "
                         f"{len(syncs['checked'].log.failures)}")
    checked = syncs.pop("checked").log
    eager = backends["checked"]
    out = {"backend": f"{(eager.inner if a.plant_probe else eager).model.config._attn_implementation} attention, "
                      f"{cfg.model.dtype}", "planted": a.plant_probe, "lr": run.lr, **merged_details([checked]),
           "push_seconds": push_seconds, "steps": [p.as_dict() for p in checked.probes], "defects": {}}
    for name, sync in syncs.items():
        first = next((p for p in sync.log.probes if not p.passed), None)
        out["defects"][name] = {"caught_at_step": first.step if first else None, "gap": first.gap if first else None,
                                "bound": sync.log.bound, "reason": first.reason if first else None}
    return out, checked.passed


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda:0" if cuda else "cpu")
    cfg = flagship_config()
    shape = TINY if args.tiny else QWEN3_1_7B
    peak = args.peak_tflops or (H200_BF16_DENSE_TFLOPS if cuda else None)
    with tempfile.TemporaryDirectory(prefix="ggpo-flagship-") as tmp:
        template, codec = template_check(cfg, args.plant_template, Path(tmp))
    progress(t0, f"template: {'passed' if template['passed'] else 'FAILED'}")
    if cuda:
        torch.cuda.set_device(device)
    deepspeed = start_distributed(cuda)
    run = Run(args, cfg, shape, device, codec, deepspeed)
    progress(t0, f"built {run.architecture}, {run.parameters:,} parameters, on {device}")
    training = training_figures(run, peak)
    memory = memory_figures(cfg, run.engine.module, shape, args, run.chunks, device)
    measured = memory["max_allocated_gib"]
    progress(t0, f"training: {training['tokens_per_second']:,.0f} tok/s, {training['model_tflops']:.3g} TFLOP/s; "
                 f"max allocated {'n/a' if measured is None else format(measured, '.2f')} GiB, the estimate's "
                 f"tensor terms {memory['estimate_tensors_gib']:.2f} GiB")
    probe, probe_passed = probe_figures(run, t0)
    run.engine.destroy()
    checks = {"probe": probe_passed, "template": template["passed"], "memory": memory["within_estimate"]}
    return {"schema": 1, "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "deepspeed": deepspeed.__version__},
            "tiny": args.tiny, "model": {"architecture": run.architecture, "shape": shape,
                                         "parameters": run.parameters},
            "training": training, "memory": memory, "probe": probe, "template": template, "checks": checks,
            "passed": all(v is not False for v in checks.values()), "seconds": time.perf_counter() - t0}


def lines(r: dict[str, Any]) -> list[str]:
    """The report for a person: one line a part, the memory terms and the planted defects under theirs."""
    t, m, p, tp = r["training"], r["memory"], r["probe"], r["template"]
    mfu = f"{100 * t['mfu']:.1f}% of {t['peak_tflops']:g} TFLOP/s" if t["mfu"] is not None else "n/a (no peak on CPU)"
    head = (f"device {r['device']}; torch {r['versions']['torch']}, transformers {r['versions']['transformers']}, "
            f"deepspeed {r['versions']['deepspeed']}; Qwen3 {r['model']['parameters'] / 1e6:,.1f}M parameters "
            f"{t['dtype']}, ZeRO-{t['zero_stage']} on {t['ranks']} rank, lr {t['lr']:g}")
    speed = (f"training: {t['timed_steps']} steps x {t['passes_per_step']} passes x {t['seq_len']} tokens "
             f"(checkpointing {t['gradient_checkpointing']}, log-prob chunks {t['chunks']['tokens']} x "
             f"{t['chunks']['vocab']}): {t['tokens_per_second']:,.0f} tok/s, 6*N*tok/s = {t['model_tflops']:.3g} "
             f"TFLOP/s, MFU {mfu}; {sum(t['step_seconds'][t['warmup_steps']:]) / t['timed_steps']:.2f} s a step")
    out = [head, speed]
    est = m["estimate_gib"]
    if m["max_allocated_gib"] is not None:
        out.append(f"memory: max allocated {m['max_allocated_gib']:.2f} GiB (reserved {m['max_reserved_gib']:.2f}) vs "
                   f"the estimate's tensor terms {m['estimate_tensors_gib']:.2f} GiB: "
                   f"{'within' if m['within_estimate'] else 'ABOVE the estimate'}; device used "
                   f"{m['device_used_gib']:.2f} GiB vs the estimate's total {est['total']:.2f} GiB")
    else:
        out.append(f"memory: not measured on the CPU; the estimate's tensor terms {m['estimate_tensors_gib']:.3f} GiB, "
                   f"total {est['total']:.2f} GiB")
    out += [f"  {k:<16} {v:8.3f} GiB" for k, v in est.items() if k != "total"]
    pushes = p["push_seconds"]
    out.append(f"probe ({p['backend']}{', planted ' + p['planted'] if p['planted'] else ''}): "
               f"{'passed' if p['passed'] else 'FAILED'} over {p['steps_checked']} pushes; baseline "
               f"{p['baseline'] if p['baseline'] is None else format(p['baseline'], '.3g')}, largest mean gap "
               f"{p['largest_gap']:.3g} (largest token gap {p['largest_token_gap']:.3g}) vs bound {p['bound']:.3g}; "
               f"decisive steps {p['decisive_steps']}; push {min(pushes):.3f}-{max(pushes):.3f} s")
    out += [f"  failed: {s['reason']}" for s in p["steps"] if not s["passed"]][:3]
    for name, d in p["defects"].items():
        out.append(f"  defect {name}: " + (f"caught at step {d['caught_at_step']} (mean gap {d['gap']:.3g} vs bound "
                                           f"{d['bound']:.3g})" if d["caught_at_step"] is not None else
                                           f"not caught in {p['steps_checked']} steps at lr {p['lr']:g}"))
    out.append(f"template ({tp['template']}): {'passed' if tp['passed'] else 'FAILED'}")
    for case in ("default", "flagship"):
        c = tp[case]
        out.append(f"  {case} {c['kwargs']}: " + ("; ".join(c["problems"]) if c["problems"] else "no problem") +
                   (f"; prompt ends {c['prompt_end']!r}" if c["prompt_end"] is not None else ""))
    failed = [k for k, v in r["checks"].items() if v is False]
    out.append(f"checks: {', '.join(f'{k} {v}' for k, v in r['checks'].items())} -> "
               f"{'passed' if r['passed'] else 'FAILED: ' + ', '.join(failed)} in {r['seconds']:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    missing = missing_modules()
    if missing:
        print(f"error: cannot import {', '.join(missing)} (torch and transformers come with the machine; DeepSpeed "
              f"as carried wheels unpacked onto PYTHONPATH: tools/gpu/README.md)", file=sys.stderr)
        return 2
    args = parse(argv)
    if args.tiny:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    else:
        import torch

        if not torch.cuda.is_available():
            print("error: no GPU here: the flagship shape needs one (--tiny runs a small config on the CPU)",
                  file=sys.stderr)
            return 2
    report = run_all(args)
    if args.json_file:
        args.json_file.write_text(json.dumps(report) + "\n")
    print(json.dumps(report) if args.json else "\n".join(lines(report)))
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
