"""Training a pretrained Hugging Face checkpoint on JSONL data: `ggpo-batch train` on 2 CPU ranks
(gloo), DeepSpeed ZeRO-2 and ZeRO-3, torch rollouts through the checkpoint's tokenizer and chat
template; the exported policy reloads with `from_pretrained`; the update raises the log-probability
of positive-advantage tokens."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # 2-rank DeepSpeed runs of a checkpoint: 7-25 s a test

from ggpo_batch.contracts.allocation import details_of
from ggpo_batch.contracts.run_record import TRAINING_STATUS_VALIDATED, check_run_record, entry_key
from ggpo_batch.train.run.job import policy_dir
from ggpo_batch.train.run.launch import train_local

SPEC = """
schema = 1
[experiment]
name = "hf-cpu"
method = "ggpo"
seeds = [7]
gpus = 4
loop_budget_seconds = 1.5
executor = "local"
[train]
max_new_tokens = 16
max_turns = 3
passage_max_bytes = 96
eval_size = 8
[train.model]
path = "{model}"
dtype = "float32"
max_model_len = 1024
[train.data]
train = "{train}"
eval = "{eval}"
passages = "{passages}"
[arms.paired_answer]
exposure = "paired"
exposed_items = 4
templates = ["train_direct", "train_role"]
auxiliary_answer_loss = true
"""


def write_spec(folder: Path, model: Path, data: dict[str, Path]) -> Path:
    path = folder / "hf-cpu.toml"
    path.write_text(SPEC.format(model=model, **data))
    return path


@pytest.fixture(scope="module")
def z2(tmp_path_factory, tiny_hf, qa_files):  # type: ignore[no-untyped-def]
    """`ggpo-batch train` of the spec above: ZeRO-2, the rank's batch in one pass."""
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    folder = tmp_path_factory.mktemp("hf-z2")
    out = folder / "record.json"
    res = CliRunner().invoke(cli, ["train", str(write_spec(folder, tiny_hf, qa_files)), "--arm", "paired_answer",
                                   "--seed", "7", "-o", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out, json.loads(out.read_text()), json.loads(details_of(out).read_text())


@pytest.fixture(scope="module")
def z3(tmp_path_factory, hf_spec):  # type: ignore[no-untyped-def]
    """The same run under ZeRO-3, in passes of 3 rows (DeepSpeed gradient accumulation)."""
    out = tmp_path_factory.mktemp("hf-z3") / "record.json"
    rec = train_local(hf_spec("paired_answer", budget=1.5, zero_stage=3, micro_batch_size=3), out, nproc=2,
                      timeout=300)
    return out, rec, json.loads(details_of(out).read_text())


def test_cli_train_takes_a_checkpoint_and_jsonl_data_to_a_validated_record(z2, tiny_hf, qa_files):  # type: ignore[no-untyped-def]
    _, rec, details = z2
    assert check_run_record(entry_key(7, "paired_answer"), rec) == []
    assert rec["training"]["status"] == TRAINING_STATUS_VALIDATED, details["audit"]["problems"]
    assert details["audit"]["problems"] == [] and details["audit"]["generated_tokens_checked"] > 0
    prompts = details["model"].pop("chat_template")
    assert details["model"] == {"path": str(tiny_hf), "resolved": str(tiny_hf), "dtype": "float32",
                                "end_of_turn": "<|im_end|>"}
    assert prompts["kwargs"] == {} and len(prompts["sha256"]) == 64 and "<|im_start|>assistant" in prompts["rendering"]
    assert details["data"] == {**{k: str(v) for k, v in qa_files.items()}, "columns": {}}  # no column renamed
    c = rec["training"]["counts"]
    assert c["steps"] >= 1 and c["trajectories"] == c["steps"] * 4 * 4 and c["actual_exposed"] >= 2
    assert len(set(details["rank_policy_sha256"])) == 1 and len(details["rank_policy_sha256"]) == 2
    assert all(math.isfinite(h["loss"]) and math.isfinite(h["gradient_norm"]) for h in details["history"])
    ev = details["evaluation"]
    assert ev["items"] == 8 and all(r["item_id"].startswith("mh-") for r in ev["per_item"])


def test_exported_policy_is_a_hugging_face_directory_that_reloads(z2, tiny_hf):  # type: ignore[no-untyped-def]
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ggpo_batch.train.pretrained.hf import directory_sha256

    out, _, details = z2
    folder = policy_dir(out)
    assert Path(details["policy_dir"]) == folder
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()}
    assert details["policy_sha256"] == directory_sha256(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    original = AutoTokenizer.from_pretrained(tiny_hf, local_files_only=True)
    assert tok.get_vocab() == original.get_vocab() and tok.chat_template == original.chat_template
    assert type(model).__name__ == "Qwen2ForCausalLM"
    trained, initial = load_file(folder / "model.safetensors"), load_file(tiny_hf / "model.safetensors")
    assert trained.keys() == initial.keys()
    assert sum(float((trained[k] - initial[k]).norm()) for k in trained) > 1e-4  # it trained
    reloaded = dict(model.named_parameters())
    assert all(torch.equal(reloaded[k], trained[k]) for k in trained)  # and reloads as written
    ids = tok.apply_chat_template([{"role": "user", "content": "Where?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_zero3_in_micro_batches_computes_the_same_first_update(z2, z3):  # type: ignore[no-untyped-def]
    """Same seed, same rollouts: ZeRO-3 in passes of 3 rows gives ZeRO-2's whole-batch loss and norm."""
    _, rec3, d3 = z3
    _, _, d2 = z2
    assert check_run_record(entry_key(7, "paired_answer"), rec3) == []
    assert rec3["training"]["status"] == TRAINING_STATUS_VALIDATED, d3["audit"]["problems"]
    assert d3["zero_stage"] == 3 and len(set(d3["rank_policy_sha256"])) == 1
    h2, h3 = d2["history"][0], d3["history"][0]
    assert h3["branch"] == "deepspeed_zero3" and h2["branch"] == "deepspeed_zero2"
    assert h3["loss"] == pytest.approx(h2["loss"], abs=1e-5)
    assert h3["gradient_norm"] == pytest.approx(h2["gradient_norm"], rel=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_updates_raise_the_logprob_of_positive_advantage_tokens(one_rank, hf_spec, tmp_path_factory, arch):  # type: ignore[no-untyped-def]
    """Three ggpo updates on one fixed batch of real rollouts of a Qwen2- and a Llama-architecture
    checkpoint: the policy's mean log-prob of the tokens of positive-advantage trajectories rises, of
    negative-advantage ones falls; the update's exported directory reloads as the same architecture."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.batch import loss_batch
    from ggpo_batch.train.policy.ggpo import group_advantages
    from ggpo_batch.train.policy.model import logprobs_of
    from ggpo_batch.train.run.trainer import Trainer
    from ggpo_batch.train.task.tiny_hf import build_checkpoint

    spec = hf_spec("clean", budget=1e9, reference_refresh_steps=100)
    if arch != "qwen2":
        folder = build_checkpoint(tmp_path_factory.mktemp(arch) / "model", arch=arch)
        spec = dataclasses.replace(spec, train={**spec.train, "model": {**spec.train["model"], "path": str(folder)}})
    cfg = TrainConfig.from_table(spec.train, "t")
    trainer = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    try:
        fixed = trainer._rollouts(trainer.curriculum.step_groups(0), 0)
        trainer._rollouts = lambda groups, step: copy.deepcopy(fixed)  # every step trains on this batch
        rewards = torch.tensor([[t.reward for t in ts] for ts in fixed])
        adv = group_advantages(rewards)
        assert adv.retained_groups >= 1
        (ids, attn, mask, _), row_adv, _ = loss_batch(0, 0, fixed, rewards, adv, 1e-6, trainer.codec.pad_id)
        sign = torch.tensor(row_adv)[:, None].expand_as(mask)

        def mean_logprob(positive: bool) -> float:
            with torch.no_grad():
                lp = logprobs_of(trainer.engine.module, ids, attn, cfg.temperature, trainer.codec)
            sel = mask & ((sign > 0) if positive else (sign < 0))
            return float(lp[sel].mean())

        pos0, neg0 = mean_logprob(True), mean_logprob(False)
        for _ in range(3):
            trainer.step()
        pos1, neg1 = mean_logprob(True), mean_logprob(False)
        assert pos1 > pos0 + 0.05, (pos0, pos1)
        assert neg1 < neg0, (neg0, neg1)
        out = tmp_path_factory.mktemp(f"{arch}-export")
        _, digest = trainer.export(out / "policy")
        assert digest and type(AutoModelForCausalLM.from_pretrained(out / "policy")).__name__.lower().startswith(arch)
    finally:
        trainer.close()
