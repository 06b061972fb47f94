"""The training job for real: 2 CPU ranks (gloo), DeepSpeed ZeRO-2 and ZeRO-3, all 5 arms."""

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from ggpo_batch.contracts.run_record import check_run_record, entry_key
from ggpo_batch.train.audit.checkpoint import META_NAME
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import build_model
from ggpo_batch.train.run.job import Preempted, policy_dir
from ggpo_batch.train.run.launch import train_local
from tests.support.waiting import preempt_after_step

pytestmark = [pytest.mark.train, pytest.mark.slow]  # 2-rank DeepSpeed runs: zero2_runs alone is 5 of them

ARM_NAMES = ("clean", "paired", "random_matched", "paired_answer", "random_answer")


def keys(d):
    return {k: (keys(v) if isinstance(v, dict) and k != "exposure_templates" else None) for k, v in d.items()}


def run(tmp_path_factory, spec, **kw):
    out = tmp_path_factory.mktemp(spec.arm.name) / "record.json"
    rec = train_local(spec, out, nproc=2, timeout=300, **kw)
    details = json.loads(Path(str(out) + ".details.json").read_text())
    return out, rec, details


@pytest.fixture(scope="module")
def zero2_runs(tmp_path_factory, spec_for):
    return {arm: run(tmp_path_factory, spec_for(arm, budget=1.5)) for arm in ARM_NAMES}


@pytest.mark.parametrize("arm", ARM_NAMES)
def test_every_arm_writes_a_valid_record_shaped_like_the_seed(zero2_runs, seed_records, arm):
    out, rec, details = zero2_runs[arm]
    assert json.loads(out.read_text()) == rec
    key = entry_key(rec["seed"], arm)
    assert check_run_record(key, rec) == []
    seed_rec = seed_records[f"20261012/{arm}"]
    assert keys(rec) == keys(seed_rec)  # field for field, incl. the aux blocks of the *_answer arms
    assert rec["training"]["status"] == "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED"
    assert details["audit"]["problems"] == [] and details["audit"]["steps_checked"] >= 1
    b = rec["budget"]
    assert b["time_budget_reached"] and b["loop_seconds"] >= b["budget_seconds"] == 1.5
    assert b["loop_seconds"] - b["last_batch_seconds"] < b["budget_seconds"]  # stopped at the first batch past it
    assert rec["timing"]["gpus"] == 4


@pytest.mark.parametrize("arm", ARM_NAMES)
def test_counts_reconcile_with_the_arm(zero2_runs, arms, arm):
    _, rec, details = zero2_runs[arm]
    c, cost, cfg = rec["training"]["counts"], rec["training"]["cost"], TrainConfig()
    assert c["trajectories"] == c["steps"] * cfg.prompts_per_step * cfg.group_size
    assert cost["backend_calls"] >= c["trajectories"]
    assert cost["rl_loss_tokens"] <= cost["backend_generated_tokens"]
    assert c["nonzero_advantage_tokens"] <= cost["rl_loss_tokens"]
    assert len(details["history"]) == c["steps"]
    for h in details["history"]:
        assert math.isfinite(h["loss"]) and math.isfinite(h["gradient_norm"]), h
        # The step's health figures (old_logprobs = "policy", the torch sampler being the policy itself):
        # no mismatch, so the ratio is 1 and nothing clips; no push, so no probe.
        assert 0 <= h["mean_reward"] <= 1 and h["kl"] >= 0 and h["clip_fraction"] == 0.0, h
        assert 0 <= h["logprob_gap_mean"] <= h["logprob_gap_p99"] < 1e-4, h
        assert h["is_weight_mean"] is None and h["weight_sync_probe"] is None
    assert set(details["history"][0]) >= {"loss", "gradient_norm", "retained_groups", "raw_gap", "mean_length",
                                          "reference_refreshed"}
    a = arms[arm]
    if a.exposure == "paired":
        assert c["shared_trajectories"] == c["shared_groups"] * cfg.group_size
        assert c["actual_exposed"] == 2 * c["shared_groups"]
    else:
        assert c["shared_groups"] == c["shared_trajectories"] == 0
    if a.exposure == "none":
        assert c["actual_exposed"] == 0 and rec["budget"]["exposure_templates"] == {}
    assert sum(rec["budget"]["exposure_templates"].values()) == c["actual_exposed"]
    aux = rec["training"]["auxiliary_sources"]
    if a.auxiliary_answer_loss:
        assert aux["examples"] + aux["skipped_no_verified_target"] == aux["groups_considered"] > 0
        assert aux["gold_checked_clean_answer"] <= aux["examples"]
        assert cost["aux_loss_tokens"] == aux["answer_tokens"]
    else:
        assert aux == {}


def test_training_changes_parameters_and_ranks_agree(zero2_runs):
    from safetensors.torch import load_file

    out, rec, details = zero2_runs["paired_answer"]
    assert rec["training"]["counts"]["nonzero_advantage_tokens"] > 0
    assert len(set(details["rank_policy_sha256"])) == 1 and len(details["rank_policy_sha256"]) == 2
    final = load_file(policy_dir(out) / "model.safetensors")
    initial = dict(build_model(TrainConfig(), rec["seed"]).named_parameters())
    assert all(bool(torch.isfinite(v).all()) for v in final.values())
    delta = sum(float((final[k] - initial[k].detach()).norm()) for k in final)
    assert delta > 1e-4


def test_zero3_trains_and_ranks_agree(tmp_path_factory, spec_for, seed_records):
    out, rec, details = run(tmp_path_factory, spec_for("paired_answer", budget=1.5, zero_stage=3))
    assert check_run_record(entry_key(rec["seed"], "paired_answer"), rec) == []
    assert details["zero_stage"] == 3 and len(set(details["rank_policy_sha256"])) == 1
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["gradient_norm"]) for h in details["history"])
    assert rec["training"]["status"] == "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED"
    z2 = load_policy(tmp_path_factory, out)
    initial = dict(build_model(TrainConfig(), rec["seed"]).named_parameters())
    assert any(not torch.equal(z2[k], initial[k].detach()) for k in z2)


def load_policy(_, out):
    from safetensors.torch import load_file

    return load_file(policy_dir(out) / "model.safetensors")


@pytest.mark.slow
def test_sigusr1_checkpoints_and_a_rerun_resumes(tmp_path, spec_for):
    out = tmp_path / "record.json"
    log0 = Path(str(out) + ".rank0.log")

    preempt_after_step(log0, 3, within_s=120)
    with pytest.raises(Preempted):
        train_local(spec_for("paired", budget=120.0), out, nproc=2, timeout=300)
    assert (Path(str(out) + ".ckpt") / META_NAME).is_file()  # a complete checkpoint (train/checkpoint.py)
    rec = train_local(spec_for("paired", budget=1.0), out, nproc=2, timeout=300)
    details = json.loads(Path(str(out) + ".details.json").read_text())
    assert details["resumed"] is True
    assert details["history"][0]["step"] == 0 and rec["training"]["counts"]["steps"] >= 4
    assert check_run_record(entry_key(rec["seed"], "paired"), rec) == []
