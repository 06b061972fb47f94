"""GPU check: ggpo steps on a Qwen2-0.5B-shaped model on one GPU, ZeRO stage 2 and 3, torch rollouts.

For a lent machine with torch and transformers and a carried DeepSpeed wheel (tools/gpu/README.md),
no vLLM: the model is random-initialised from a `Qwen2Config` of Qwen2-0.5B's shape (no download),
bf16, one rank. Each step: rollouts from the torch sampler's behaviour copy (ggpo_batch's own
`TorchSampler`, KV cache), a synthetic verifiable reward (the share of even token ids a rollout
wrote), group advantages and the ggpo loss against a frozen reference, one DeepSpeed update, then the
weight push into the behaviour copy layer by layer with its log-prob probe (train/weight_sync.py).
(The trainer's torch rollouts sample from the policy itself, gathered under ZeRO-3; a separate copy
is kept here so that the push a colocated vLLM engine gets is timed, the one GPU figure that needs it.)

Printed per stage: rollout tokens/s (generated tokens / rollout seconds), training tokens/s
(non-padding tokens of the loss batch / training-phase seconds), the training phase's model-FLOPs
utilisation MFU = 6 * N * training tokens / training seconds / peak FLOP/s (N = all parameters,
embeddings included; 6N per token counts the policy's forward and backward only, not the
reference's forward: a lower bound), peak GPU memory (torch.cuda.max_memory_allocated), and the
weight-sync seconds with the probe's largest mean gap (train/probe.py). Peak: H200 bf16 dense, about 989 TFLOP/s
(--peak-tflops). The first step of each stage is warm-up and left out of the rates.

`--tiny` runs a small config on the CPU (gloo, float32) in under a minute: how this file is tested
here (tests/train/test_gpu_script.py). `--json` prints one JSON object instead of the lines.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

H200_BF16_DENSE_TFLOPS = 989.0
# Qwen2-0.5B's shape (its config.json): 24 layers, hidden 896, 14 query / 2 key-value heads.
QWEN2_05B: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768, "rope_theta": 1e6,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
TINY: dict[str, Any] = {
    "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}
NEEDED = ("torch", "transformers", "deepspeed")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a small config on the CPU (the local test)")
    ap.add_argument("--stages", default="2,3", help="ZeRO stages to run, in order (default 2,3)")
    ap.add_argument("--steps", type=int, default=4, help="steps per stage, the first one warm-up (default 4)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (default 8)")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per prompt (default 8)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="tokens per prompt (default 128)")
    ap.add_argument("--new-tokens", type=int, default=256, help="tokens sampled per rollout (default 256)")
    ap.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS,
                    help=f"the device's dense peak for MFU (default {H200_BF16_DENSE_TFLOPS:g}, H200 bf16)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.tiny:
        args.prompts, args.group_size, args.prompt_tokens, args.new_tokens = 2, 4, 16, 16
        args.steps = min(args.steps, 3)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or any(s not in ("2", "3") for s in stages):
        ap.error(f"--stages: ZeRO stages 2 and/or 3, comma-separated, got {args.stages!r}")
    args.stages = [int(s) for s in stages]
    if args.steps < 2 or args.prompts < 1 or args.group_size < 2 or args.prompt_tokens < 2 or args.new_tokens < 1:
        ap.error("--steps >= 2 (one warm-up), --prompts >= 1, --group-size >= 2, --prompt-tokens >= 2, --new-tokens >= 1")
    return args


def missing_modules() -> list[str]:
    import importlib.util

    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def start_distributed(cuda: bool) -> None:
    """One rank: torchrun-style variables, NCCL on the GPU, gloo on the CPU (DeepSpeed imported as the
    trainer imports it: on the CPU without its shared-memory op, whose JIT build's lock a killed run
    leaves behind for every later one to wait on)."""
    from ggpo_batch.train.deepspeed_import import import_deepspeed

    deepspeed = import_deepspeed(cuda)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        from ggpo_batch.netutil import free_port

        os.environ["MASTER_PORT"] = str(free_port())
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False)


def build(shape: dict[str, Any], dtype: Any, device: Any, seed: int) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**shape, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def synthetic_reward(tokens: tuple[int, ...]) -> float:
    """Share of even token ids: verifiable, and a policy can learn to raise it."""
    return sum(1 for t in tokens if t % 2 == 0) / max(1, len(tokens))


def run_stage(stage: int, args: argparse.Namespace, shape: dict[str, Any], device: Any, dtype: Any) -> dict[str, Any]:
    import deepspeed
    import torch

    from ggpo_batch.train.codec import ByteCodec
    from ggpo_batch.train.ggpo import ggpo_loss, group_advantages, token_logprobs
    from ggpo_batch.train.ggpo_config import GgpoConfig
    from ggpo_batch.train.rollout import TorchSampler
    from ggpo_batch.train.weight_sync import WeightSync

    cuda = device.type == "cuda"
    model = build(shape, dtype, device, seed=stage)
    n_params = sum(p.numel() for p in model.parameters())
    reference = copy.deepcopy(model).requires_grad_(False)
    behaviour = copy.deepcopy(model).requires_grad_(False)  # the sampler's own copy: the push is timed into it
    bf16 = dtype == torch.bfloat16
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}, "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0, "torch_adam": True}}})
    # ByteCodec: end-of-sequence id 256 ends a rollout (rare under random weights); pads with it.
    codec = ByteCodec(max_model_len=args.prompt_tokens + args.new_tokens)
    sampler = TorchSampler(behaviour, codec)
    gen = torch.Generator().manual_seed(stage)
    probe = torch.randint(1000, shape["vocab_size"], (32,), generator=gen).tolist()
    sync = WeightSync(engine.module, stage, sampler, probe, "bfloat16" if bf16 else "float32", device)
    gcfg = GgpoConfig(group_size=args.group_size)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    steps: list[dict[str, Any]] = []
    for step in range(args.steps):
        prompts = [torch.randint(1000, shape["vocab_size"], (args.prompt_tokens,), generator=gen).tolist()
                   for _ in range(args.prompts) for _ in range(args.group_size)]
        t0 = time.perf_counter()
        gens = sampler.generate(prompts, args.new_tokens, 1.0, seed=step)
        if cuda:
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        rewards = torch.tensor([synthetic_reward(g.tokens) for g in gens]).view(args.prompts, args.group_size)
        adv = group_advantages(rewards, gcfg.advantage_eps).advantages.flatten()
        width = max(len(p) + len(g.tokens) for p, g in zip(prompts, gens))
        ids = torch.full((len(gens), width), codec.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        mask = torch.zeros((len(gens), width - 1), dtype=torch.bool)
        blp = torch.zeros((len(gens), width - 1))
        for i, (p, g) in enumerate(zip(prompts, gens)):
            row = p + list(g.tokens)
            ids[i, :len(row)], attn[i, :len(row)] = torch.tensor(row), 1
            mask[i, len(p) - 1:len(row) - 1] = True
            blp[i, len(p) - 1:len(row) - 1] = torch.tensor(g.logprobs)
        ids, attn, mask, blp, adv = (x.to(device) for x in (ids, attn, mask, blp, adv))
        logp = token_logprobs(engine(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1], ids[:, 1:])
        with torch.no_grad():
            ref = token_logprobs(reference(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1],
                                 ids[:, 1:])
        loss, _ = ggpo_loss(logp, blp, ref, adv, mask, gcfg)
        engine.backward(loss)
        engine.step()
        if cuda:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        sync_seconds = sync.push(step)
        generated, trained = sum(len(g.tokens) for g in gens), int(attn.sum())
        steps.append({"step": step, "loss": float(loss.detach()), "mean_reward": float(rewards.mean()),
                      "rollout_seconds": t1 - t0, "generated_tokens": generated, "train_seconds": t2 - t1,
                      "train_tokens": trained, "weight_sync_seconds": sync_seconds})
        del logp, ref, loss
    timed = steps[1:]  # the first step warms the kernels and the allocator up
    roll_s, train_s = sum(s["rollout_seconds"] for s in timed), sum(s["train_seconds"] for s in timed)
    train_tokens = sum(s["train_tokens"] for s in timed)
    flops = 6 * n_params * train_tokens / train_s
    out = {"zero_stage": stage, "parameters": n_params, "dtype": str(dtype).replace("torch.", ""),
           "steps": len(steps), "timed_steps": len(timed),
           "rollout_tokens_per_second": sum(s["generated_tokens"] for s in timed) / roll_s,
           "train_tokens_per_second": train_tokens / train_s,
           "train_model_tflops": flops / 1e12,
           "mfu": flops / (args.peak_tflops * 1e12) if cuda else None,
           "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
           "weight_sync_seconds": [s["weight_sync_seconds"] for s in steps],
           "probe": {"passed": sync.log.passed, "largest_gap": max(p.gap for p in sync.log.probes),
                     "bound": sync.log.bound},
           "loss": [s["loss"] for s in steps], "mean_reward": [s["mean_reward"] for s in steps]}
    engine.destroy()
    del engine, model, reference, behaviour, sampler, sync
    if cuda:
        torch.cuda.empty_cache()
    return out


def line(r: dict[str, Any], peak: float) -> str:
    mfu = f"{100 * r['mfu']:.1f}% of {peak:g} TFLOP/s" if r["mfu"] is not None else "n/a (CPU)"
    mem = f"{r['peak_gpu_memory_gib']:.1f} GiB" if r["peak_gpu_memory_gib"] is not None else "n/a (CPU)"
    sync = r["weight_sync_seconds"]
    return (f"ZeRO-{r['zero_stage']} {r['parameters'] / 1e6:.2f}M params {r['dtype']}: rollout "
            f"{r['rollout_tokens_per_second']:,.0f} tok/s, training {r['train_tokens_per_second']:,.0f} tok/s, "
            f"MFU {mfu} (6*N*tokens/time/peak = {r['train_model_tflops']:.2f} TFLOP/s), peak memory {mem}, "
            f"weight sync {min(sync):.3f}-{max(sync):.3f} s/step, probe "
            f"{'passed' if r['probe']['passed'] else 'FAILED'} (largest mean gap {r['probe']['largest_gap']:.2g} "
            f"<= {r['probe']['bound']:.2g}), loss {r['loss'][0]:.4f} -> {r['loss'][-1]:.4f}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    missing = missing_modules()
    if missing:
        print(f"error: cannot import {', '.join(missing)} (tools/gpu/README.md: carry the DeepSpeed wheel and put "
              f"its folder on PYTHONPATH)", file=sys.stderr)
        return 2
    import torch

    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    device = torch.device("cuda:0" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    start_distributed(cuda)
    shape, dtype = (TINY, torch.float32) if args.tiny else (QWEN2_05B, torch.bfloat16 if cuda else torch.float32)
    results = [run_stage(stage, args, shape, device, dtype) for stage in args.stages]
    report = {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
              "peak_tflops": args.peak_tflops, "stages": results}
    if args.json:
        print(json.dumps(report))
    else:
        print(f"device {report['device']}, torch {report['torch']}")
        for r in results:
            print(line(r, args.peak_tflops))
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(r["probe"]["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
