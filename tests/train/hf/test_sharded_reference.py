"""The reference model under ZeRO-3 on 2 gloo ranks: a DeepSpeed engine whose parameters are
partitioned like the policy's (each rank holds about half), round-tripped through a checkpoint's
state, refreshed from the policy parameter by parameter; two updates whose KL term reads it match
ZeRO-2 with a whole reference on every rank to 1e-5, and a perturbed reference is caught. The torch
sampler under ZeRO-3 is the policy itself, its weights gathered only while it generates."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # three 2-rank runs, about 20 s each

from ggpo_batch.common.netutil import free_port
from ggpo_batch.train.run.rankfork import ForkServer

ROOT = Path(__file__).resolve().parents[3]


def run(hf_spec, folder: Path, zero_stage: int, *extra: str) -> tuple[list[dict], dict]:  # type: ignore[no-untyped-def]
    """The worker on 2 ranks: (each rank's JSON, the policy after the updates)."""
    folder.mkdir(parents=True)
    spec = hf_spec("clean", budget=1e9, zero_stage=zero_stage, reference_refresh_steps=2, kl_coef=0.5,
                   micro_batch_size=6, logprob_chunk_tokens=5, logprob_chunk_vocab=200)
    (folder / "spec.json").write_text(spec.to_json())
    port, prefix = free_port(), str(folder / "out")
    procs = []
    for rank in range(2):  # forked as a local run forks its ranks (train/rankfork.py)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
        log = folder / f"rank{rank}.log"
        procs.append((ForkServer.start_rank([str(folder / "spec.json"), prefix, *extra], env, log,
                                            target="tests.train.hf.sharded_worker:main", cwd=ROOT), log))
    for p, log in procs:
        assert p.wait(timeout=300) == 0, log.read_text()[-4000:]
    ranks = [json.loads(Path(f"{prefix}.rank{r}.json").read_text()) for r in range(2)]
    return ranks, torch.load(prefix + ".pt")


@pytest.fixture(scope="module")
def runs(hf_spec, tmp_path_factory):  # type: ignore[no-untyped-def]
    base = tmp_path_factory.mktemp("sharded")
    return {"z2": run(hf_spec, base / "z2", 2), "z3": run(hf_spec, base / "z3", 3),
            "z3_perturbed": run(hf_spec, base / "z3p", 3, "--perturb-reference")}


def test_the_zero3_reference_is_partitioned_over_the_ranks(runs):  # type: ignore[no-untyped-def]
    z3, _ = runs["z3"]
    z2, _ = runs["z2"]
    for r in z3:
        assert r["reference_is_engine"]
        # Every matrix partitioned (norms under 10 x hidden elements stay whole): about half each.
        assert r["reference_held"] < 0.55 * r["reference_total"], r
        assert r["reference_held"] == r["policy_held"] and r["reference_total"] == r["policy_total"]
        assert "model.embed_tokens.weight" in r["reference_partitioned"]
        assert any(".mlp.down_proj." in n for n in r["reference_partitioned"])
    assert sum(r["reference_held"] for r in z3) < 1.05 * z3[0]["reference_total"]
    for r in z3:  # no behaviour copy: the torch sampler gathers the policy for the rollouts only
        assert r["sampler_is_policy"] and r["policy_held_generating"] == r["policy_total"]
        assert r["policy_held_after"] == r["policy_held"] < 0.55 * r["policy_total"]
    for r in z2:  # ZeRO-2: the policy is whole on every rank, and so is the plain reference
        assert not r["reference_is_engine"] and r["reference_held"] == r["reference_total"]


def test_updates_through_the_sharded_reference_match_the_whole_one(runs):  # type: ignore[no-untyped-def]
    (z3, w3), (z2, w2) = runs["z3"], runs["z2"]
    h3, h2 = z3[0]["history"], z2[0]["history"]
    assert [h["reference_refreshed"] for h in h3] == [False, True]
    for a, b in zip(h3, h2):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["gradient_norm"] == pytest.approx(b["gradient_norm"], rel=1e-5)
    assert abs(h3[1]["loss"] - h3[0]["loss"]) > 1e-3  # the second update's KL term reads the reference
    assert max(float((w3[k] - w2[k]).abs().max()) for k in w2) < 1e-5
    for r in z3 + z2:  # refreshed after the second update: the reference is the policy again
        assert r["refresh_max_difference"] == 0.0


def test_a_perturbed_reference_would_be_caught(runs):  # type: ignore[no-untyped-def]
    (zp, wp), (z2, w2) = runs["z3_perturbed"], runs["z2"]
    assert zp[0]["history"][0]["loss"] != pytest.approx(z2[0]["history"][0]["loss"], abs=1e-5)
    assert max(float((wp[k] - w2[k]).abs().max()) for k in w2) > 1e-5
