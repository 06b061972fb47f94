"""The one-shot GPU check of the flagship run (jobs/exposure-5arm.toml) on one lent GPU, in minutes.

For a machine with torch, transformers and a carried DeepSpeed wheel only (tools/gpu/README.md): no
vLLM, no download. What the flagship does each step, on each of its 4 ranks (ZeRO-2, bf16): 8
prompts x 8 responses a step, 16 rollouts a rank from a colocated vLLM engine (asleep while the
policy trains); group advantages; the loss rows packed into passes of at most max_tokens_per_pass =
8192 padded tokens (micro_batch_size = 0: no row cap; longest first, train/policy/passes.py); then
one optimizer update (train/run/trainer.py `_update`): per pass the policy's chunked log-probs with
grad (gradient checkpointing, SDPA; detached, the old log-probs of old_logprobs = "policy": no
forward of their own), the reference's without grad, the ggpo loss (kl_coef 0.001) scaled
by the pass's share of the tokens, backward, DeepSpeed's step with the accumulation boundary at the
last pass; the reference takes the policy's weights every 4 updates; then the weights are pushed
into vLLM and probed (train/run/weight_sync.py).

Here a Qwen3-1.7B-shaped model (its config.json's shape, `QWEN3_1_7B`) is built from config in
bfloat16, random-initialised, on one rank (world size 1), with the flagship spec's `[train]`
settings read from the packaged example spec, and trained by the trainer's own `_plan` and `_update`
(tools/gpu/flagship_train.py). What it reuses from the package, so that it checks the package and
not a copy: the DeepSpeed config (train/policy/engine_config.py), checkpointing
(train/pretrained/hf.training_mode), the collation and pass plan (train/policy/batch.py, passes.py),
the chunked log-probs (train/policy/logprobs.py), the reference (train/policy/reference.py), the
loss (train/policy/ggpo.py), the update (train/run/trainer.py), the weight push and its probe
(train/run/weight_sync.py, train/audit/probe.py), the memory formula (train/policy/gpu_memory.py)
and the chat-template check (train/pretrained/chat_template.py). Not here: the rollouts (vLLM), the
answer-loss arms' extra pass, more than one rank's collectives.

Four parts, each printed:

1. Training: `--steps` timed steps (after `--warmup`) of random rows: by default `--passes` rows of
   `--seq-len` tokens (max_model_len: each row fills a pass alone, the memory check's worst case);
   with `--packed`, `--rows` rows (16: a flagship rank's) of lengths uniform over `--row-tokens`,
   packed by the trainer's plan into multi-row padded passes. Three figures (tools/gpu/flops.py
   defines them): tokens/s (the rows' real tokens over the timed steps' wall time); MFU by PaLM's
   definition, 6N + 12·L·H·Q·T FLOPs a token, N all parameters (tied embeddings once), attention
   without causal halving; and the step's FLOP utilisation, every FLOP the step computes: padding,
   the policy's forward and backward, checkpointing's recomputed forward, the chunked LM head's
   recomputed logits, and each forward without grad the step ran (the reference's, and the old
   log-probs' if the trainer ran one: none today; counted by hooks on the models, so a change to
   the trainer shows). The peak is the
   dense bf16 figure of the device's datasheet by its name (H100 SXM / NVL / PCIe, H200, A100) or
   `--peak-tflops`; the JSON's `peak_source` says which.
2. Memory: torch.cuda.max_memory_allocated over the training steps beside gpu_memory.py's estimate
   for the largest pass run (one rank, ZeRO-2, torch rollouts: no vLLM reservation). Its tensor
   terms (all but cuda_context, nccl and allocator_slack) must cover the measured peak (check
   `memory`); the device's used memory (mem_get_info) is shown beside the estimate's total.
3. Probe: an eager-attention copy of the same weights is the rollout backend; after every update of
   `--probe-steps` more steps the policy's weights are pushed into it and probed (WeightSync, the
   trainer's own), SDPA against eager on real kernels: every probe must pass (check `probe`). Copies
   with each planted defect of tools/bench/probe_calibration.py (a skipped layer, gate/up swapped, an
   fp8 cast, pushes that stop) are probed beside it, as figures: which the criterion caught, when.
   `--plant-probe DEFECT` gives the checked backend that defect (the check must then fail).
4. Template: the Qwen3-style thinking template (train/task/tiny_hf.THINKING_CHAT_TEMPLATE) over a
   tokenizer built offline, checked by train/pretrained/chat_template.check as preflight checks it:
   it must refuse the template's default and pass with the flagship spec's `chat_template_kwargs`
   (enable_thinking = false) (check `template`). `--plant-template` checks a thinking-only template.

Exit 0 when every check passed, 1 when one failed, 2 for bad arguments, no GPU without `--tiny`, a
Python or transformers older than it needs, or a module that cannot be imported (each one line on
stderr). `--tiny` runs a small Qwen3-shaped config on the CPU (gloo, bfloat16, about 10 seconds):
what tests/train/test_gpu_script.py runs. `--json` prints one JSON object (`--json-file` writes it too).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere in the checkout

from tools.gpu.flagship_probe import STOP_AFTER, probe_figures, progress
from tools.gpu.flagship_train import (  # stdlib only at import: the version checks come first
    QWEN3_1_7B,
    ROW_TOKENS,
    TINY,
    TINY_RUN,
    Run,
    build,
    flagship_spec,
    start_distributed,
    training_figures,
)
from tools.gpu.flops import peak_for

__all__ = ["QWEN3_1_7B", "STOP_AFTER", "TINY", "TINY_RUN", "build", "main"]
PYTHON_FLOOR = (3, 11)  # setup.cfg's python_requires (tests/train/test_gpu_flops.py holds them equal)
NEEDED = ("torch", "transformers", "deepspeed", "jinja2", "tokenizers")
NON_TENSOR_TERMS = ("cuda_context", "nccl", "allocator_slack")  # gpu_memory terms max_memory_allocated omits
GIB = 1 << 30


def parse(argv: list[str] | None) -> argparse.Namespace:
    from tools.bench.probe_calibration import DEFECTS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a small config on the CPU (what the suite runs)")
    ap.add_argument("--steps", type=int, help="timed training steps (default 4; --tiny 2)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default 1)")
    ap.add_argument("--passes", type=int, help="rows a step, one a pass, unpacked (default 4; --tiny 2)")
    ap.add_argument("--seq-len", type=int, help="tokens a row, unpacked (default the flagship's max_model_len; --tiny 96)")
    ap.add_argument("--packed", action="store_true", help="rows of varied lengths packed into multi-row passes")
    ap.add_argument("--rows", type=int, help="rows a step with --packed (default a flagship rank's, 16; --tiny 6)")
    ap.add_argument("--row-tokens", help=f"LO:HI, the --packed rows' lengths, uniform (default "
                                         f"{ROW_TOKENS[0]}:{ROW_TOKENS[1]}; --tiny 24:64)")
    ap.add_argument("--prompt-tokens", type=int, help="tokens of a row outside the loss (default 512; --tiny 16)")
    ap.add_argument("--probe-steps", type=int, help="steps with a weight push and probe after each (default 30)")
    ap.add_argument("--lr", type=float, help="learning rate (default the flagship spec's; --tiny 1e-3)")
    ap.add_argument("--peak-tflops", type=float,
                    help="the device's dense bf16 peak for MFU (default: from the GPU's name, tools/gpu/flops.py; "
                         "none on the CPU)")
    ap.add_argument("--plant-probe", choices=DEFECTS, help="give the checked rollout backend this defect")
    ap.add_argument("--plant-template", action="store_true", help="check a thinking-only template (no switch)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--json-file", type=Path, help="also write the JSON object to this file")
    args = ap.parse_args(argv)
    defaults = TINY_RUN if args.tiny else {"steps": 4, "warmup": 1, "passes": 4, "seq_len": None,
                                           "prompt_tokens": 512, "probe_steps": 30, "rows": None,
                                           "row_tokens": ROW_TOKENS}
    for key in ("steps", "warmup", "passes", "seq_len", "prompt_tokens", "probe_steps", "rows", "row_tokens"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.steps < 1 or args.warmup < 0 or args.passes < 1 or args.probe_steps < STOP_AFTER + 1:
        ap.error(f"--steps >= 1, --warmup >= 0, --passes >= 1, --probe-steps >= {STOP_AFTER + 1}")
    cfg, gpus = flagship_spec()
    args.seq_len = args.seq_len or cfg.model.max_model_len
    if args.rows is None:  # a flagship rank's loss rows: prompts_per_step / gpus groups of group_size
        from ggpo_batch.train.policy.passes import rows_per_pass

        args.rows = rows_per_pass(cfg, gpus)
    if isinstance(args.row_tokens, str):
        try:
            args.row_tokens = tuple(int(x) for x in args.row_tokens.split(":"))
        except ValueError:
            ap.error("--row-tokens is LO:HI, two integers")
        if len(args.row_tokens) != 2 or not 0 < args.row_tokens[0] <= args.row_tokens[1]:
            ap.error("--row-tokens is LO:HI with 0 < LO <= HI")
    shortest = args.row_tokens[0] if args.packed else args.seq_len
    if not 2 <= args.prompt_tokens < shortest:
        ap.error("--prompt-tokens must be at least 2 and less than every row (--seq-len, --row-tokens' LO)")
    if args.rows < 1:
        ap.error("--rows >= 1")
    if args.lr is not None and args.lr <= 0 or args.peak_tflops is not None and args.peak_tflops <= 0:
        ap.error("--lr and --peak-tflops must be positive")
    return args


def unmet_python(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """One line when this Python is older than PYTHON_FLOOR (the package's floor: tomllib, its syntax)."""
    if tuple(version[:2]) >= PYTHON_FLOOR:
        return None
    return (f"error: Python {'.'.join(map(str, version))} is older than the {'.'.join(map(str, PYTHON_FLOOR))} "
            f"this check and the package need")


def unmet_transformers(found: str | None = None) -> str | None:
    """One line when the installed transformers (its metadata, not imported) is older than the package's
    floor (train/versions.py: from_config/from_pretrained honour `dtype=` from it)."""
    from ggpo_batch.train.versions import MINIMUM_VERSIONS, installed_version, older

    minimum = MINIMUM_VERSIONS["transformers"]
    found = found if found is not None else installed_version(minimum)
    if found is None or not older(found, minimum.version):
        return None  # not installed: missing_modules says so
    return (f"error: transformers {found} is older than the {minimum.version} this check needs "
            f"({minimum.why})")


def missing_modules() -> list[str]:
    import importlib.util

    return [m for m in NEEDED if importlib.util.find_spec(m) is None]


def memory_figures(cfg: Any, model: Any, shape: dict[str, Any], pass_tokens: int, chunks: Any,
                   device: Any) -> dict[str, Any]:
    """gpu_memory.py's estimate for this shape and the largest pass run (`pass_tokens` padded tokens, as
    one row: what preflight evaluates the formula at), in GiB by term, beside what CUDA measured."""
    import torch

    from ggpo_batch.train.policy.gpu_memory import memory_estimate

    cuda = device.type == "cuda"
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory if cuda else 0
    parts = memory_estimate(
        parameters=sum(p.numel() for p in model.parameters()), dtype_bytes=model.dtype.itemsize, ranks=1,
        zero_stage=cfg.zero_stage, rows=1, seq_len=pass_tokens, hidden=shape["hidden_size"],
        layers=shape["num_hidden_layers"], vocab=shape["vocab_size"],
        gradient_checkpointing=bool(model.is_gradient_checkpointing),
        rollout="torch", vllm_fraction=0.0, gpu_bytes=gpu_bytes, chunk_tokens=chunks.tokens,
        chunk_vocab=chunks.vocab)
    tensors = parts["total"] - sum(parts[k] for k in NON_TENSOR_TERMS)
    out: dict[str, Any] = {"pass_tokens": pass_tokens, "estimate_gib": {k: v / GIB for k, v in parts.items()}, "estimate_tensors_gib": tensors / GIB,
                           "max_allocated_gib": None, "max_reserved_gib": None, "device_used_gib": None,
                           "device_total_gib": gpu_bytes / GIB if cuda else None, "within_estimate": None}
    if cuda:
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device)
        out.update(max_allocated_gib=peak / GIB, max_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB,
                   device_used_gib=(total - free) / GIB, within_estimate=peak <= tensors)
    return out


def template_check(cfg: Any, plant: bool, folder: Path) -> tuple[dict[str, Any], Any]:
    """train/chat_template.check of a Qwen3-style template with the default keywords and with the
    flagship spec's; returns the figures and the codec with the flagship's keywords (the run's: its
    template aside, what the training and the probe read of it is that no token is environment-only)."""
    from ggpo_batch.train.pretrained import chat_template
    from ggpo_batch.train.task import tiny_hf
    from ggpo_batch.train.task.codec import HfCodec

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


def peak(args: argparse.Namespace, device_name: str | None) -> tuple[float | None, str | None, str | None]:
    """(dense bf16 TFLOP/s, "argument" | "device_name", the datasheet's board): `--peak-tflops` first,
    else the GPU's name looked up (tools/gpu/flops.py); none on the CPU or for an unknown GPU."""
    if args.peak_tflops:
        return args.peak_tflops, "argument", None
    found = peak_for(device_name) if device_name else None
    return (found[1], "device_name", found[0]) if found else (None, None, None)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda:0" if cuda else "cpu")
    device_name = torch.cuda.get_device_name(device) if cuda else None
    peak_tflops, peak_source, board = peak(args, device_name)
    if cuda and peak_tflops is None:
        progress(t0, f"no peak known for {device_name!r}: MFU and FLOP utilisation not computed (--peak-tflops)")
    cfg, gpus = flagship_spec()
    shape = TINY if args.tiny else QWEN3_1_7B
    with tempfile.TemporaryDirectory(prefix="ggpo-flagship-") as tmp:
        template, codec = template_check(cfg, args.plant_template, Path(tmp))
    progress(t0, f"template: {'passed' if template['passed'] else 'FAILED'}")
    if cuda:
        torch.cuda.set_device(device)
    deepspeed = start_distributed(cuda)
    run = Run(args, cfg, gpus, shape, device, codec, deepspeed)
    progress(t0, f"built {run.architecture}, {run.parameters:,} parameters, on {device}")
    training = training_figures(run, peak_tflops, peak_source)
    training["peak_board"] = board
    largest = max(len(p["lengths"]) * p["width"] for s in training["steps"] for p in s["passes"])
    memory = memory_figures(cfg, run.engine.module, shape, largest, run.chunks, device)
    measured = memory["max_allocated_gib"]
    progress(t0, f"training: {training['tokens_per_second']:,.0f} tok/s, {training['model_tflops']:.3g} model "
                 f"TFLOP/s, {training['executed_tflops']:.3g} computed; max allocated "
                 f"{'n/a' if measured is None else format(measured, '.2f')} GiB, the estimate's tensor terms "
                 f"{memory['estimate_tensors_gib']:.2f} GiB")
    probe, probe_passed = probe_figures(run, t0)
    run.engine.destroy()
    checks = {"probe": probe_passed, "template": template["passed"], "memory": memory["within_estimate"]}
    return {"schema": 2, "device": device_name or "cpu",
            "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "transformers": transformers.__version__, "deepspeed": deepspeed.__version__},
            "tiny": args.tiny, "model": {"architecture": run.architecture, "shape": shape,
                                         "parameters": run.parameters,
                                         "body_parameters": run.flop_shape.body_parameters},
            "training": training, "memory": memory, "probe": probe, "template": template, "checks": checks,
            "passed": all(v is not False for v in checks.values()), "seconds": time.perf_counter() - t0}


def lines(r: dict[str, Any]) -> list[str]:
    """The report for a person: one line a part, the memory terms and the planted defects under theirs."""
    t, m, p, tp = r["training"], r["memory"], r["probe"], r["template"]
    if t["mfu"] is not None:
        where = t["peak_board"] or "--peak-tflops" if t["peak_source"] == "device_name" else "--peak-tflops"
        util = (f"MFU {100 * t['mfu']:.3g}%, FLOP utilisation {100 * t['flop_utilisation']:.3g}% of "
                f"{t['peak_tflops']:g} TFLOP/s ({where})")
    else:
        util = "MFU n/a (no peak: --peak-tflops)"
    passes = [len(s["passes"]) for s in t["steps"][t["warmup_steps"]:]]
    forwards = t["steps"][-1]["forwards_per_pass"]
    head = (f"device {r['device']}; torch {r['versions']['torch']}, transformers {r['versions']['transformers']}, "
            f"deepspeed {r['versions']['deepspeed']}; Qwen3 {r['model']['parameters'] / 1e6:,.1f}M parameters "
            f"{t['dtype']}, ZeRO-{t['zero_stage']} on {t['ranks']} rank, lr {t['lr']:g}")
    speed = (f"training: {t['timed_steps']} steps, {'packed passes' if t['packed'] else 'one row a pass'}, at most "
             f"{t['pass_token_budget']} tokens a pass ({'/'.join(map(str, passes))} passes a step; {t['tokens']:,} tokens, "
             f"{t['padded_tokens']:,} padded), checkpointing {t['gradient_checkpointing']}, log-prob chunks "
             f"{t['chunks']['tokens']} x {t['chunks']['vocab']}: {t['tokens_per_second']:,.0f} tok/s, "
             f"{sum(t['step_seconds'][t['warmup_steps']:]) / t['timed_steps']:.2f} s a step")
    flops = (f"  FLOPs: model (PaLM 6N + 12LHQT a token) {t['model_tflops']:.3g} TFLOP/s, computed "
             f"{t['executed_tflops']:.3g} TFLOP/s (a pass: forward + backward, recompute "
             f"{forwards['checkpointing']}, head recompute {forwards['chunked_head']}, old log-probs "
             f"{forwards['old_logprobs']}, reference {forwards['reference']}); {util}")
    out = [head, speed, flops]
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
    unmet = unmet_python()
    if unmet:
        print(unmet, file=sys.stderr)
        return 2
    missing = missing_modules()
    if missing:
        print(f"error: cannot import {', '.join(missing)} (torch and transformers come with the machine; DeepSpeed "
              f"as carried wheels unpacked onto PYTHONPATH: tools/gpu/README.md)", file=sys.stderr)
        return 2
    unmet = unmet_transformers()
    if unmet:
        print(unmet, file=sys.stderr)
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
