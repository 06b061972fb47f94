"""The GPU-memory formula (ggpo_batch/train/policy/gpu_memory.py), term by term against bytes computed by hand for a
Qwen3-1.7B-shaped model (bf16, ZeRO-2 on 4 GPUs), and the flagship spec's dry run printing the whole
breakdown against its profile's 80 GiB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggpo_batch.train.policy.gpu_memory import GIB, breakdown, memory_estimate
from tests.support.specs import flagship_with

P = 1_720_574_976  # Qwen3-1.7B: 28 x 50,336,000 per layer + 151,936 x 2,048 embedding (tied) + 2,048 norm
CONTEXT = int(1.8 * GIB)  # vllm-project/vllm#10511: 1.79 GiB non-torch memory per process, as much per communicator
FLAGSHIP = {"parameters": P, "dtype_bytes": 2, "ranks": 4, "zero_stage": 2, "rows": 1, "seq_len": 8192,
            "hidden": 2048, "layers": 28, "vocab": 151936, "gradient_checkpointing": True, "rollout": "vllm",
            "vllm_fraction": 0.35, "gpu_bytes": 80 * GIB, "chunk_tokens": 1024, "chunk_vocab": 8192}
TERMS = ["weights", "gradients", "fp32_gradients", "optimizer", "adam_step", "reduce_bucket", "allgather_bucket",
         "reference", "rollout", "activations", "recomputed_layer", "logits", "lm_head_gradient", "cuda_context",
         "nccl", "allocator_slack", "total"]


def test_each_term_of_the_flagship_shape_against_bytes_computed_by_hand():
    parts = memory_estimate(**FLAGSHIP)
    assert list(parts) == TERMS
    # The rank's partition of the gradients accumulated in float32 (4 bytes x P / 4), whatever the dtype.
    assert parts["weights"] == parts["reference"] == 2 * P and parts["gradients"] == P
    assert parts["optimizer"] == 3 * P  # 12 bytes x P / 4
    # A bf16 bucket reduced in float32 (2e8 x 4 bytes); foreach AdamW's float32 sqrt of the second moment.
    assert parts["fp32_gradients"] == 800_000_000 and parts["adam_step"] == 1_720_574_976
    assert parts["reduce_bucket"] == 800_000_000  # 2e8 elements x 2 bytes, two buffers (overlap_comm at ZeRO-2)
    assert parts["allgather_bucket"] == 0  # ZeRO-2 gathers the updated partitions in place
    assert parts["rollout"] == 0.35 * 80 * GIB
    assert parts["activations"] == 8192 * 2048 * 28 * 2 == 939_524_096
    assert parts["recomputed_layer"] == 8192 * 2048 * 34 == 570_425_344  # one layer's activations, recomputed
    assert parts["logits"] == 1024 * 8192 * 14 + 8192 * 2048 * 6 == 218_103_808
    # The LM head's weight gradient in bf16, and one vocabulary chunk of it summed in float32.
    assert parts["lm_head_gradient"] == 151936 * 2048 * 2 + 8192 * 2048 * 4 == 689_438_720
    assert parts["cuda_context"] == CONTEXT == 1_932_735_283
    assert parts["nccl"] == 2 * CONTEXT  # torch's world group and DeepSpeed's clone of it
    assert parts["allocator_slack"] == GIB
    context = parts["cuda_context"] + parts["nccl"] + parts["allocator_slack"]
    assert 6 * GIB <= context <= 9 * GIB  # the flagship's CUDA/NCCL context
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    assert 50 * GIB < parts["total"] < 60 * GIB  # 52.6 GiB of the profile's 80


def test_the_terms_follow_the_stage_dtype_and_engines():
    z3 = memory_estimate(**{**FLAGSHIP, "zero_stage": 3})
    assert z3["allgather_bucket"] == 50_000_000 * 2  # stage 3's prefetch bucket
    assert z3["reduce_bucket"] == 400_000_000 and z3["fp32_gradients"] == 800_000_000  # one bucket, its float32 copy
    assert z3["gradients"] == P and z3["adam_step"] == P  # P / 4 < one 1e9 sub-group
    big = memory_estimate(**{**FLAGSHIP, "zero_stage": 3, "parameters": 8_000_000_000, "ranks": 2})
    assert big["adam_step"] == 4 * 1_000_000_000 and big["gradients"] == 4 * 4_000_000_000  # capped at sub_group_size
    fp32 = memory_estimate(**{**FLAGSHIP, "dtype_bytes": 4})
    assert fp32["fp32_gradients"] == 0 and fp32["reduce_bucket"] == 1_600_000_000  # reduced as it is
    assert fp32["gradients"] == P
    assert memory_estimate(**{**FLAGSHIP, "tensor_parallel_size": 2})["nccl"] == 3 * CONTEXT  # + the engine's TP group
    assert memory_estimate(**{**FLAGSHIP, "rollout": "torch", "tensor_parallel_size": 2})["nccl"] == 2 * CONTEXT
    plain = memory_estimate(**{**FLAGSHIP, "gradient_checkpointing": False, "chunk_tokens": 0})
    assert plain["recomputed_layer"] == 0 and plain["lm_head_gradient"] == 151936 * 2048 * 2


def test_the_breakdown_prints_every_term_against_the_gpu():
    gib = {k: round(v / GIB, 2) for k, v in memory_estimate(**FLAGSHIP).items()}
    lines = breakdown(gib, 80)
    assert [ln.split()[0] for ln in lines] == TERMS
    assert lines[-1].endswith("GiB of 80 GiB per GPU: fits") and " 52.56 GiB" in lines[-1]
    assert breakdown({**gib, "total": 81.0}, 80)[-1].endswith("does NOT fit")


@pytest.fixture
def flagship(tmp_path: Path) -> Path:
    """jobs/exposure-5arm.toml with its model a Qwen3-1.7B-shaped checkpoint (config, a sparse
    safetensors file, a tokenizer with a Qwen3-like template) and its data a QA set built here."""
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from ggpo_batch.train.task.tiny_hf import build_qa_set
    from tests.support.shaped_checkpoint import qwen3_1_7b

    data = build_qa_set(tmp_path / "qa", n_train=200, n_eval=160)
    return flagship_with(tmp_path, qwen3_1_7b(tmp_path / "Qwen3-1.7B"), data)


@pytest.mark.slow  # two dry runs of the flagship: preflight measures 680 prompts each time
def test_the_flagship_dry_run_prints_the_completed_breakdown(flagship, ledger, env, monkeypatch):  # type: ignore[no-untyped-def]
    if not env["GGPO_DB_URL"].startswith("sqlite"):
        pytest.skip("preflight runs before the ledger: one backend is enough")
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")  # a dry run queues nothing
    res = CliRunner().invoke(cli, ["enqueue", str(flagship), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert any(ln.startswith("preflight: ok (1,720,574,976 parameters") for ln in out), res.output
    at = out.index("GPU memory per GPU, by term (ggpo_batch/train/policy/gpu_memory.py):")
    shown = out[at + 1: at + 1 + len(TERMS)]
    assert [ln.split()[0] for ln in shown] == TERMS
    values = {ln.split()[0]: float(ln.split()[1]) for ln in shown}
    assert values["gradients"] == values["adam_step"] == 1.6 and values["fp32_gradients"] == values["reduce_bucket"] == 0.75
    assert values["recomputed_layer"] == 0.53 and values["lm_head_gradient"] == 0.64 and values["nccl"] == 3.6
    assert shown[-1].endswith("GiB of 80 GiB per GPU: fits")
    res = CliRunner().invoke(cli, ["enqueue", str(flagship), "--dry-run", "--json"], catch_exceptions=False)
    pre = json.loads(res.output)["preflight"]
    assert sorted(pre["gpu_memory_estimate_gib"]) == sorted(TERMS) and pre["gpu_memory_gib"] == 80
    assert pre["parameters"] == P and pre["gpu_memory_estimate_gib"]["total"] == values["total"]
    assert ledger.experiments() == []  # a dry run writes nothing
