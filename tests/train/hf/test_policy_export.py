"""The trained policy's export (Trainer.export): in the training dtype, written by rank 0 alone, every
rank's digest hashed tensor by tensor as the weights stream. That the ranks' digests agree on 2 ranks
(ZeRO-2 and ZeRO-3) is checked by the 2-rank runs of test_hf_training.py and tests/train/test_training.py."""

from __future__ import annotations

import hashlib
import tracemalloc

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ggpo_batch.train.policy.model import update_digest


def streamed(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, t in tensors.items():
        update_digest(h, name, t)
    return h.hexdigest()


def joined(tensors: dict[str, torch.Tensor]) -> str:
    """The former digest (planted defect here): one bytes object of the whole model, then a copy joined."""
    return hashlib.sha256(b"".join(t.numpy().tobytes() for t in tensors.values())).hexdigest()


def python_heap_peak(fn, *args) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn(*args)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_digest_streams_tensor_by_tensor_without_a_copy_of_the_model():
    """What tracemalloc sees is the Python heap (bytes, numpy): the streaming digest builds nothing there
    (it reads each host tensor's own memory), where the joined one held the model twice. Torch's own
    host copies (one tensor at a time, of a GPU tensor) are outside what this measures."""
    g = torch.Generator().manual_seed(0)
    tensors = {f"layer.{i}.weight": torch.randn(1024, 1024, generator=g) for i in range(8)}  # 32 MiB
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    assert python_heap_peak(streamed, tensors) < 256 << 10
    assert python_heap_peak(joined, tensors) > size  # the measurement sees a joined copy when there is one
    bf16 = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    assert python_heap_peak(streamed, bf16) < 256 << 10  # any dtype, read as it is held
    # Name, dtype and shape are hashed with the bytes: a renamed, cast or reshaped tensor changes it.
    base = streamed(tensors)
    assert streamed({"renamed" if k == "layer.0.weight" else k: v for k, v in tensors.items()}) != base
    assert streamed(bf16) != base and streamed({k: v.view(512, 2048) for k, v in tensors.items()}) != base
    assert streamed({k: v.clone() for k, v in tensors.items()}) == base


@pytest.mark.train
@pytest.mark.slow
@pytest.mark.parametrize("policy", ["checkpoint", "builtin"])
def test_export_is_in_the_training_dtype_and_the_digest_is_of_its_tensors(one_rank, hf_spec, spec_for, tmp_path,
                                                                          policy):  # type: ignore[no-untyped-def]
    """bfloat16 training, of the tiny checkpoint (`[train.model] dtype`) and of the built-in model
    (`precision = "bf16"`, which the former export wrote in float32)."""
    import dataclasses

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.pretrained.hf import directory_sha256
    from ggpo_batch.train.run.trainer import Trainer

    if policy == "builtin":
        spec = spec_for("clean", budget=1e9, precision="bf16")
    else:
        spec = hf_spec("clean", budget=1e9)
        spec = dataclasses.replace(spec, train={**spec.train, "model": {**spec.train["model"], "dtype": "bfloat16"}})
    cfg = TrainConfig.from_table(spec.train, "t")
    trainer = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    try:
        trainer.step()
        digest, policy_sha256 = trainer.export(tmp_path / "policy")
        held = {n: p.detach() for n, p in trainer.engine.module.named_parameters()}
    finally:
        trainer.close()
    assert all(t.dtype == torch.bfloat16 for t in held.values())  # DeepSpeed trains the bf16 weights
    written = load_file(tmp_path / "policy" / "model.safetensors")
    assert written.keys() == held.keys() and all(t.dtype == torch.bfloat16 for t in written.values())
    assert all(torch.equal(written[n], held[n]) for n in held)
    assert digest == streamed({n: written[n] for n in held}) == streamed(held)  # the digest is of what was written
    assert policy_sha256 == directory_sha256(tmp_path / "policy")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "policy", local_files_only=True)
    assert model.dtype == torch.bfloat16
    assert all(torch.equal(p, held[n]) for n, p in model.named_parameters() if n in held)
