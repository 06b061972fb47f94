"""Two CPU ranks train the tiny checkpoint with vLLM rollouts colocated in each rank (external
launcher): the weights reach the engines in memory after every step (no weight file is ever written,
seen from the kernel's file events), each step records its sync time and probe, and the log-prob probe
passes. The run takes `old_logprobs = "rollout"`: the engine's log-probs through the truncated
importance weights, whose figures the history records beside the mismatch, clip fraction and KL."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.train, pytest.mark.slow]


def test_two_rank_run_syncs_in_memory_and_the_probe_passes(tmp_path, monkeypatch, hf_spec):  # type: ignore[no-untyped-def]
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED, check_run_record
    from ggpo_batch.train.run.job import policy_dir
    from ggpo_batch.train.run.launch import train_local
    from tests.support.file_watch import CreatedFiles

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the ranks' temporary files land under the watch
    out = tmp_path / "run" / "r.json"
    spec = hf_spec("paired", budget=600.0, rollout="vllm", max_steps=2, eval_size=2, old_logprobs="rollout")
    with CreatedFiles(tmp_path) as created:
        rec = train_local(spec, out, nproc=2, timeout=900)
    details = json.loads(details_of(out).read_text())
    assert check_run_record("7/paired", rec) == []
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED, details["audit"]["problems"]
    assert details["world_size"] == 2 and details["rollout"] == "vllm"
    history = details["history"]
    assert len(history) == rec["training"]["counts"]["steps"] == 2
    assert all(h["weight_sync_seconds"] > 0 for h in history)
    probe = details["audit"]["weight_sync_probe"]
    assert probe["checked"] and probe["passed"] and probe["steps_checked"] == 2 and probe["failed_steps"] == []
    assert probe["largest_gap"] < probe["bound"] == 4e-5  # vllm-cpu runs float32: 4 x the float32 floor
    assert [h["weight_sync_probe"]["step"] for h in history] == [0, 1]
    assert all(h["weight_sync_probe"]["passed"] and h["weight_sync_probe"]["tokens"] > 200 for h in history)
    for h in history:  # the engine (float32) and the policy agree: weights ~1, none truncated
        assert 0 <= h["logprob_gap_mean"] <= h["logprob_gap_p99"] < 1e-3 and h["clip_fraction"] == 0.0
        assert h["is_weight_mean"] == pytest.approx(1.0, abs=1e-3) and h["is_truncated_fraction"] == 0.0
        assert h["kl"] >= 0 and 0 <= h["mean_reward"] <= 1
    # The one weight file of the run is the exported policy: none per step, none for the engines.
    assert created.named(".safetensors") == {policy_dir(out) / "model.safetensors"}
