import subprocess
import sys

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig


def test_empty_table_is_the_tiny_cpu_setup():
    cfg = TrainConfig.from_table({}, "jobs/x.toml")
    assert cfg == TrainConfig()
    assert (cfg.zero_stage, cfg.rollout, cfg.model, cfg.data) == (2, "torch", None, None)


def test_values_are_parsed_and_ints_widen_to_floats():
    cfg = TrainConfig.from_table({"zero_stage": 3, "lr": 1, "rollout": "vllm", "group_size": 8}, "j.toml")
    assert (cfg.zero_stage, cfg.lr, cfg.rollout, cfg.group_size) == (3, 1.0, "vllm", 8)


@pytest.mark.parametrize("table, field, words", [
    ({"zero_stage": 1}, "train.zero_stage", "2 or 3"),
    ({"rollout": "hf"}, "train.rollout", "torch, vllm"),
    ({"group_size": 1}, "train.group_size", ">= 2"),
    ({"lr": "fast"}, "train.lr", "number"),
    ({"max_turns": True}, "train.max_turns", "integer"),
    ({"bogus": 1}, "train.bogus", "unknown key"),
    ({"model": {}}, "train.model.path", "required"),
    ({"model": "m"}, "train.model", "must be a table"),
    ({"model": {"path": "m", "dtype": "fp8"}}, "train.model.dtype", "bfloat16, float16, float32"),
    ({"model": {"path": "m", "gradient_checkpointing": 1}}, "train.model.gradient_checkpointing", "true or false"),
    ({"model": {"path": "m", "attn_implementation": "magic"}}, "train.model.attn_implementation", "sdpa"),
    ({"model": {"path": "m", "max_model_len": 4}}, "train.model.max_model_len", "16.."),
    ({"model": {"path": "m", "revision": "main"}}, "train.model.revision", "unknown key"),
    ({"model": {"path": "m"}, "n_layer": 4}, "train.n_layer", "built-in model only"),
    ({"model": {"path": "m"}, "precision": "bf16"}, "train.precision", "train.model.dtype"),
    ({"data": {"train": "t.jsonl", "eval": "e.jsonl"}}, "train.data.passages", "required"),
    ({"data": {"train": "t", "eval": "e", "passages": "p", "dev": "d"}}, "train.data.dev", "unknown key"),
    ({"max_new_tokens": 400}, "train.n_positions", "too small"),
    ({"old_logprobs": "engine"}, "train.old_logprobs", "policy, rollout"),
    ({"rollout_is_cap": 3.0}, "train.rollout_is_cap", "old_logprobs = \"rollout\" only"),
    ({"old_logprobs": "rollout", "rollout_is_cap": 0.5}, "train.rollout_is_cap", "[1, 1e6]"),
])
def test_bad_input_names_file_and_field(table, field, words):
    with pytest.raises(SpecError) as err:
        TrainConfig.from_table(table, "jobs/x.toml")
    assert err.value.field == field and err.value.path == "jobs/x.toml"
    assert words in err.value.problem
    assert str(err.value).startswith(f"jobs/x.toml: {field}: ")


def test_config_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['deepspeed'] = None\n"
            "from ggpo_batch.train.config import TrainConfig; print(TrainConfig.from_table({}, 'x').zero_stage)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"


def test_model_and_data_tables_parse_and_round_trip():
    table = {"model": {"path": "/m", "dtype": "float32", "gradient_checkpointing": True, "max_model_len": 2048},
             "data": {"train": "/d/t.jsonl", "eval": "/d/e.jsonl", "passages": "/d/p.jsonl"}}
    cfg = TrainConfig.from_table(table, "j.toml")
    assert (cfg.model.path, cfg.model.dtype, cfg.model.attn_implementation, cfg.max_model_len) == (
        "/m", "float32", "sdpa", 2048)
    assert TrainConfig.from_table(cfg.to_table(), "j.toml") == cfg
    assert "model" not in TrainConfig().to_table()  # the built-in model's table has no [train.model]


def test_spec_paths_are_taken_from_the_spec_folder(tmp_path):
    from ggpo_batch.spec.parse import load_spec

    (tmp_path / "models" / "m").mkdir(parents=True)
    spec = tmp_path / "jobs" / "x.toml"
    spec.parent.mkdir()
    spec.write_text("""
[experiment]
name = "x"
method = "ggpo"
seeds = [1]
[train.model]
path = "../models/m"
[train.data]
train = "../data/train.jsonl"
eval = "~/e.jsonl"
passages = "/abs/p.jsonl"
[arms.clean]
""")
    train = load_spec(spec).train
    assert train["model"]["path"] == str(tmp_path / "models" / "m")
    assert train["data"]["train"] == str(tmp_path / "data" / "train.jsonl")
    assert train["data"]["eval"].endswith("/e.jsonl") and not train["data"]["eval"].startswith("~")
    assert train["data"]["passages"] == "/abs/p.jsonl"
    # A hub id that is no folder next to the spec stays a hub id (resolved from the local HF cache).
    spec.write_text(spec.read_text().replace("../models/m", "Qwen/Qwen3-1.7B"))
    assert load_spec(spec).train["model"]["path"] == "Qwen/Qwen3-1.7B"


def test_old_logprobs_is_resolved_into_the_run_spec_and_its_hash(tmp_path):
    """The default of `[train] old_logprobs` is written into the run spec: a spec that leaves it out hashes
    like one that writes "policy", and unlike one that writes "rollout" (whose cap is written out too)."""
    from ggpo_batch.spec.parse import load_spec

    def run_spec(train: str):  # type: ignore[no-untyped-def]
        path = tmp_path / "x.toml"
        path.write_text(f"[experiment]\nname = \"x\"\nmethod = \"ggpo\"\nseeds = [1]\n[train]\n{train}\n[arms.clean]\n")
        spec = load_spec(path)
        return spec, spec.expand(1)[0]

    omitted, run = run_spec("")
    assert omitted.train == {"old_logprobs": "policy"} and run.train["old_logprobs"] == "policy"
    written, run_policy = run_spec('old_logprobs = "policy"')
    rollout, run_rollout = run_spec('old_logprobs = "rollout"')
    _, run_capped = run_spec('old_logprobs = "rollout"\nrollout_is_cap = 2.0')
    assert run.config_hash == run_policy.config_hash and omitted.spec_hash == written.spec_hash
    assert run_rollout.config_hash != run_policy.config_hash and rollout.spec_hash != written.spec_hash
    assert run_rollout.train["rollout_is_cap"] == TrainConfig.rollout_is_cap == 2.0
    assert run_capped.config_hash == run_rollout.config_hash
    assert TrainConfig.from_table(run_rollout.train, "x").old_logprobs == "rollout"
