import subprocess
import sys

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig


def test_empty_table_is_the_tiny_cpu_setup():
    cfg = TrainConfig.from_table({}, "jobs/x.toml")
    assert cfg == TrainConfig()
    assert (cfg.zero_stage, cfg.rollout, cfg.task) == (2, "torch", "synthetic")


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
    ({"task": "jsonl"}, "train.train_path", "required"),
    ({"max_new_tokens": 400}, "train.n_positions", "too small"),
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
