"""tools/gpu/flagship_check.py, the one-shot GPU check of the flagship shape, run here with --tiny on the
CPU: every figure it prints is present and agrees with the package's own formulas, every check passes
on the correct run and fails on a planted defect, and neither the script nor the package code it
runs imports anything the lent GPU machine lacks (it has torch, transformers and a carried DeepSpeed
wheel only)."""

from __future__ import annotations

import configparser
import json
import math
import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import REPO

pytestmark = [pytest.mark.train, pytest.mark.slow]
SCRIPT = REPO / "tools" / "gpu" / "flagship_check.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1")
# Runs SCRIPT with an import guard: a module the GPU machine lacks, imported from this checkout's
# code (the package, tools/), fails as it would there. Third-party code's optional imports (torch's
# of redis, DeepSpeed's of mlflow) are theirs: they handle an ImportError, and the device has none.
GUARD = """
import importlib.abc, runpy, sys
repo, blocked, script, *argv = sys.argv[1:]
blocked = set(blocked.split(","))
class Guard(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in blocked:
            return None
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename.startswith("<frozen"):
            f = f.f_back
        where = f.f_code.co_filename if f is not None else ""
        if where.startswith(repo) and "/.venv/" not in where:
            raise ModuleNotFoundError(f"no module {name!r} on the GPU machine (imported by {where})", name=name)
        return None
sys.meta_path.insert(0, Guard())
sys.argv = [script, *argv]
runpy.run_path(script, run_name="__main__")
"""


def not_on_the_device() -> list[str]:
    """The package's own requirements (none of which the GPU machine has), and vLLM."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    names = [re.split(r"[\[<>=~! ]", line.strip())[0].lower().replace("-", "_")
             for line in cfg["options"]["install_requires"].splitlines() if line.strip()]
    return [*names, "vllm"]


def run_guarded(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GUARD, str(REPO), ",".join(not_on_the_device()), str(SCRIPT), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=ENV, check=False)


def report_of(out: subprocess.CompletedProcess) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


# The tiny shape's numbers, written out (tools/gpu/flagship_train.TINY): layers, hidden, query and
# key-value heads, head dimension, MLP width, vocabulary; tied embeddings.
L, D, HEADS, KV, Q, MLP, V = 2, 64, 2, 1, 32, 128, 1024


def tiny_parameters_by_hand() -> int:
    """q, k, v, o, gate/up/down, input and post-attention norms, q and k norms a layer; the final norm;
    the embedding (tied: the LM head is the same matrix)."""
    layer = D * HEADS * Q + 2 * D * KV * Q + HEADS * Q * D + 3 * D * MLP + 2 * D + 2 * Q
    return L * layer + D + V * D


def tiny_flops_by_hand(n: int) -> tuple[int, int]:
    """One unpacked --tiny step, 2 passes of one 96-token row with 80 targets under the loss: (PaLM's
    model FLOPs, the FLOPs the step computes). PaLM: T (6N + 12 L H Q T) a row. Computed, a pass: the
    policy's forward with grad f = the body's 2 N_body T + attention's 4 L H Q T^2 + the LM head's 2 D V
    at the 80 targets; its backward 2f; checkpointing's recomputed body; the chunked head's recomputed
    logits; the reference's f. No forward of the old log-probs (old_logprobs = "policy" takes the
    update's own, detached: issue 39)."""
    rows, seq, targets = 2, 96, 96 - 16
    body_params = n - V * D
    body = 2 * body_params * seq + 4 * L * HEADS * Q * seq * seq
    head = 2 * D * V * targets
    f = body + head
    per_pass = f + 2 * f + body + head + f
    return rows * seq * (6 * n + 12 * L * HEADS * Q * seq), rows * per_pass


def test_tiny_run_reports_every_figure_and_passes_every_check():
    from ggpo_batch.train.policy.gpu_memory import memory_estimate
    from tools.bench.probe_calibration import DEFECTS
    from tools.gpu.flagship_check import NON_TENSOR_TERMS, STOP_AFTER, TINY, TINY_RUN

    out = run_guarded("--tiny", "--json", "--peak-tflops", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    r = report_of(out)
    assert r["schema"] == 2 and r["device"] == "cpu" and r["tiny"] is True and r["passed"] is True
    assert r["checks"] == {"probe": True, "template": True, "memory": None}  # memory: measured on a GPU only
    assert r["model"]["architecture"] == "Qwen3ForCausalLM" and r["model"]["shape"] == TINY
    n = r["model"]["parameters"]
    assert (TINY["num_hidden_layers"], TINY["hidden_size"], TINY["num_attention_heads"], TINY["num_key_value_heads"],
            TINY["head_dim"], TINY["intermediate_size"], TINY["vocab_size"]) == (L, D, HEADS, KV, Q, MLP, V)
    assert n == tiny_parameters_by_hand() and r["model"]["body_parameters"] == n - V * D

    # Training as the trainer trains: ZeRO-2, checkpointing on, SDPA, chunked log-probs, timed steps,
    # one 96-token row a pass (unpacked), and the three figures against FLOPs computed by hand.
    t = r["training"]
    assert (t["zero_stage"], t["ranks"], t["dtype"], t["gradient_checkpointing"], t["attn_implementation"]) == \
        (2, 1, "bfloat16", True, "sdpa")
    assert (t["chunks"]["tokens"], t["chunks"]["vocab"]) == (TINY_RUN["chunk_tokens"], TINY_RUN["chunk_vocab"])
    assert t["timed_steps"] == TINY_RUN["steps"] and len(t["step_seconds"]) == TINY_RUN["warmup"] + TINY_RUN["steps"]
    assert all(s > 0 for s in t["step_seconds"]) and all(math.isfinite(x) for x in t["loss"])
    assert t["packed"] is False and t["peak_tflops"] == 2 and t["peak_source"] == "argument"
    rows, seq, prompt = TINY_RUN["passes"], TINY_RUN["seq_len"], TINY_RUN["prompt_tokens"]
    for step in t["steps"]:
        assert step["passes"] == [{"lengths": [seq], "width": seq, "loss_tokens": seq - prompt}] * rows
    timed = sum(t["step_seconds"][t["warmup_steps"]:])
    assert t["tokens"] == t["padded_tokens"] == TINY_RUN["steps"] * rows * seq
    assert t["tokens_per_second"] == pytest.approx(t["tokens"] / timed)
    model, computed = tiny_flops_by_hand(n)
    assert t["model_flops"] == TINY_RUN["steps"] * model and t["executed_flops"] == TINY_RUN["steps"] * computed
    assert t["model_tflops"] == pytest.approx(TINY_RUN["steps"] * model / timed / 1e12)
    assert t["mfu"] == pytest.approx(TINY_RUN["steps"] * model / timed / 1e12 / 2)
    assert t["flop_utilisation"] == pytest.approx(TINY_RUN["steps"] * computed / timed / 1e12 / 2)

    # Memory: gpu_memory.py's estimate for this very shape and run, its tensor terms apart.
    m = r["memory"]
    gib = 1 << 30
    expected = memory_estimate(
        parameters=n, dtype_bytes=2, ranks=1, zero_stage=2, rows=1, seq_len=TINY_RUN["seq_len"],
        hidden=TINY["hidden_size"], layers=TINY["num_hidden_layers"], vocab=TINY["vocab_size"],
        gradient_checkpointing=True, rollout="torch", vllm_fraction=0.0, gpu_bytes=0,
        chunk_tokens=t["chunks"]["tokens"], chunk_vocab=t["chunks"]["vocab"])
    assert m["estimate_gib"] == pytest.approx({k: v / gib for k, v in expected.items()})
    assert m["estimate_tensors_gib"] == pytest.approx(
        (expected["total"] - sum(expected[k] for k in NON_TENSOR_TERMS)) / gib)
    assert m["max_allocated_gib"] is None and m["within_estimate"] is None and m["pass_tokens"] == TINY_RUN["seq_len"]

    # The probe, SDPA policy against an eager copy: every push passes, each with its statistics.
    p = r["probe"]
    assert p["passed"] is True and p["planted"] is None and p["backend"] == "eager attention, bfloat16"
    assert p["steps_checked"] == TINY_RUN["probe_steps"] and p["failed_steps"] == []
    assert len(p["steps"]) == TINY_RUN["probe_steps"] + 1 and p["steps"][0]["step"] == -1  # the baseline first
    assert 0 < p["baseline"] and p["largest_gap"] <= p["bound"] and len(p["push_seconds"]) == TINY_RUN["probe_steps"]
    assert p["decisive_steps"] > 0  # at --tiny's learning rate the policy moves past the noise
    assert set(p["defects"]) == set(DEFECTS)
    stopped = p["defects"]["stopped"]
    assert stopped["caught_at_step"] is not None and stopped["caught_at_step"] >= STOP_AFTER

    # The thinking template: refused at its default, passed with the flagship spec's keywords.
    tp = r["template"]
    assert tp["passed"] is True and tp["flagship"]["kwargs"] == {"enable_thinking": False}
    assert any("enable_thinking" in line for line in tp["default"]["problems"])
    assert tp["flagship"]["problems"] == [] and tp["flagship"]["prompt_end"].endswith("<think>\n\n</think>\n\n")


def test_packed_passes_run_the_trainers_plan_and_their_flops_match_a_hand_count():
    """--packed: rows of 24-64 tokens packed by the trainer's plan into passes of at most 128 padded
    tokens, several rows a pass; each step's FLOPs recomputed here from its passes as run."""
    from ggpo_batch.train.policy.passes import plan
    from tools.gpu.flagship_check import TINY_RUN

    out = run_guarded("--tiny", "--packed", "--json", "--peak-tflops", "3")
    assert out.returncode == 0, out.stderr[-3000:]
    r = report_of(out)
    t, n = r["training"], r["model"]["parameters"]
    assert t["packed"] is True and t["pass_token_budget"] == TINY_RUN["pass_tokens"] == 128
    assert (t["peak_tflops"], t["peak_source"]) == (3, "argument")
    lo, hi = TINY_RUN["row_tokens"]
    multi_row = 0
    for step in t["steps"]:
        passes = step["passes"]
        lengths = [x for p in passes for x in p["lengths"]]
        assert len(lengths) == TINY_RUN["rows"] and all(lo <= x <= hi for x in lengths)
        # What the package's plan makes of these rows (longest first, so its row indices are positions here).
        assert [[lengths[i] for i in p.rows] for p in plan(lengths, 128)] == [p["lengths"] for p in passes]
        for p in passes:
            assert p["width"] == max(p["lengths"]) and len(p["lengths"]) * p["width"] <= 128
            assert p["loss_tokens"] == sum(x - TINY_RUN["prompt_tokens"] for x in p["lengths"])
            multi_row += len(p["lengths"]) > 1
        assert step["forwards_per_pass"] == {"old_logprobs": 0, "reference": 1, "checkpointing": True,
                                             "chunked_head": True}  # no forward of the old log-probs
        model = sum(x * (6 * n + 12 * L * HEADS * Q * x) for x in lengths)
        computed = 0
        for p in passes:
            rows, w = len(p["lengths"]), p["width"]
            body = 2 * (n - V * D) * rows * w + 4 * L * HEADS * Q * rows * w * w
            head = 2 * D * V * p["loss_tokens"]
            computed += 3 * (body + head) + body + head + (body + head)  # + the reference's forward
        assert (step["model_flops"], step["executed_flops"]) == (model, computed)
    assert multi_row
    timed = t["steps"][t["warmup_steps"]:]
    seconds = sum(t["step_seconds"][t["warmup_steps"]:])
    assert t["tokens"] == sum(x for s in timed for p in s["passes"] for x in p["lengths"])
    assert t["padded_tokens"] == sum(len(p["lengths"]) * p["width"] for s in timed for p in s["passes"]) > t["tokens"]
    assert t["tokens_per_second"] == pytest.approx(t["tokens"] / seconds)
    assert t["mfu"] == pytest.approx(sum(s["model_flops"] for s in timed) / seconds / 1e12 / 3)
    assert t["flop_utilisation"] == pytest.approx(sum(s["executed_flops"] for s in timed) / seconds / 1e12 / 3)
    assert r["memory"]["pass_tokens"] == max(len(p["lengths"]) * p["width"] for s in t["steps"] for p in s["passes"])
    assert r["passed"] is True


def test_planted_defects_fail_their_checks_and_the_exit_code(tmp_path):
    """A push that stops after STOP_AFTER pushes, and a thinking-only template without a switch."""
    saved = tmp_path / "report.json"
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--plant-probe", "stopped", "--plant-template",
                          "--json-file", str(saved)], cwd=REPO, capture_output=True, text=True, timeout=300, env=ENV,
                         check=False)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "checks: probe False, template False, memory None -> FAILED: probe, template" in out.stdout
    r = json.loads(saved.read_text())
    assert r["passed"] is False and r["checks"] == {"probe": False, "template": False, "memory": None}
    assert r["probe"]["planted"] == "stopped" and r["probe"]["failed_steps"]
    flagship = " ".join(r["template"]["flagship"]["problems"])
    assert "never read" in flagship and "open <think> reasoning block" in flagship


def test_bad_arguments_and_a_missing_module_exit_2():
    out = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--probe-steps", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env=ENV, check=False)
    assert out.returncode == 2 and "--probe-steps" in out.stderr
    # -S: without site-packages, as on a machine where the DeepSpeed wheel was not carried (nor the rest).
    out = subprocess.run([sys.executable, "-S", str(SCRIPT), "--tiny"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env=ENV, check=False)
    assert out.returncode == 2 and "cannot import torch, transformers, deepspeed" in out.stderr


def test_the_flagship_shape_is_qwen3_1_7b():
    """Its published parameter count (tied embeddings), built on the meta device: no memory, no time."""
    import torch

    from tools.gpu.flagship_check import QWEN3_1_7B, build

    model = build(QWEN3_1_7B, torch.bfloat16, "meta", "sdpa")
    assert sum(p.numel() for p in model.parameters()) == 1_720_574_976
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_carried_wheels_unpack_only_where_they_fit(tmp_path):
    """tools/gpu/unpack_wheels.py: pure-Python wheels, this CPython's and the stable ABI's; not another's."""
    import zipfile

    from tools.gpu.unpack_wheels import fits, main

    assert fits("deepspeed-0.19.8-py3-none-any.whl", (3, 12))
    assert fits("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (3, 12))
    assert not fits("pydantic_core-2.50.5-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", (3, 12))
    assert fits("psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.whl", (3, 12))
    assert not fits("future-1.0-cp313-abi3-manylinux2010_x86_64.whl", (3, 12))
    here = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    names = {"pure-1.0-py3-none-any.whl": "pure", f"native-1.0-{here}-{here}-linux_x86_64.whl": "native",
             "other-1.0-cp27-cp27mu-linux_x86_64.whl": "other"}
    for name, package in names.items():
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            z.writestr(f"{package}/__init__.py", "")
    assert main([str(tmp_path), str(tmp_path / "site")]) == 0
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["native", "pure"]
    assert main([str(tmp_path / "site"), str(tmp_path / "none")]) == 2  # no wheel there
