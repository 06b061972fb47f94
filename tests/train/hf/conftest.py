"""The real-model path's fixtures: a tiny Qwen2-architecture checkpoint with a BPE tokenizer trained on
the project's generated QA text and a ChatML chat template, and a multi-hop QA set in the
`[train.data]` format, both built offline once per session (ggpo_batch/train/task/tiny_hf.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from ggpo_batch.contracts.runspec import RunSpec
from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set
from tests.support.arms import ARMS
from tests.support.specs import one_seed_spec


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face checkpoint directory: config, model.safetensors, tokenizer files, chat template."""
    return build_checkpoint(tmp_path_factory.mktemp("tiny-hf") / "model")


@pytest.fixture(scope="session")
def qa_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train.jsonl (200 items), eval.jsonl (200), passages.jsonl (1,200): two-hop questions."""
    return build_qa_set(tmp_path_factory.mktemp("qa"))


def train_table(model: Path, data: dict[str, Path], **train: object) -> dict:
    """A `[train]` table naming the tiny checkpoint (float32 on the CPU) and the QA files."""
    table = {"model": {"path": str(model), "dtype": "float32", "max_model_len": 1024},
             "data": {k: str(v) for k, v in data.items()},
             "max_new_tokens": 16, "max_turns": 3, "passage_max_bytes": 96, "eval_size": 8}
    table.update(train)
    return table


@pytest.fixture(scope="session")
def hf_table(tiny_hf: Path, qa_files: dict[str, Path]):  # type: ignore[no-untyped-def]
    """hf_table(**train) -> the `[train]` table of the tiny checkpoint and QA set."""
    return lambda **train: train_table(tiny_hf, qa_files, **train)


@pytest.fixture(scope="session")
def hf_spec(tiny_hf: Path, qa_files: dict[str, Path]):  # type: ignore[no-untyped-def]
    """hf_spec(arm, budget=..., **train) -> a RunSpec training the tiny checkpoint on the QA set."""

    def make(arm: str, *, seed: int = 7, budget: float = 1.5, **train: object) -> RunSpec:
        return RunSpec(run_key=f"{seed}/{arm}", experiment="hf-test", experiment_version=1, method="ggpo",
                       arm=ARMS[arm], seed=seed, gpus=4, loop_budget_seconds=budget, executor="local",
                       profile="default", train=train_table(tiny_hf, qa_files, **train))

    return make


@pytest.fixture(scope="module")
def one_rank():  # type: ignore[no-untyped-def]
    """A one-rank gloo process group in this process (the trainer's collectives need one), once per
    module, released as a job releases its own (DeepSpeed's cached clone of the world group too),
    so the next module of the same xdist worker can start another."""
    pytest.importorskip("deepspeed")
    import os

    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.run.job import init_process_group, release_process_group

    saved = dict(os.environ)
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())})
    init_process_group(cuda=False)
    yield
    release_process_group()
    os.environ.clear()
    os.environ.update(saved)


# The [train...] and [arms...] tables of `write`'s spec (tests/support/specs.py writes the rest).
HF_SPEC_BODY = """
[train]
max_new_tokens = 16
max_turns = 3
passage_max_bytes = 96
eval_size = 4
{train}
[train.model]
path = "{model}"
dtype = "{dtype}"
max_model_len = {max_model_len}
{model_extra}
[train.data]
train = "{train_file}"
eval = "{eval_file}"
passages = "{passages_file}"
[arms.clean]
[arms.paired]
exposure = "paired"
exposed_items = {exposed}
templates = ["train_direct", "train_role"]
"""


@pytest.fixture
def write(tmp_path, tiny_hf, qa_files):  # type: ignore[no-untyped-def]
    """write(**fields) -> a spec file for the tiny checkpoint and QA set, with fields replaced
    (`train`: more [train] lines, `model_extra`: more [train.model] lines)."""

    def make(**fields: object) -> Path:
        values = {"name": "hf-pre", "gpus": 4, "executor": "local", "profile": "default", "model": tiny_hf,
                  "dtype": "float32", "max_model_len": 1024, "exposed": 4, "train": "", "model_extra": "",
                  "train_file": qa_files["train"], "eval_file": qa_files["eval"], "passages_file": qa_files["passages"]}
        values.update(fields)
        return one_seed_spec(tmp_path, str(values["name"]), HF_SPEC_BODY.format(**values), gpus=int(values["gpus"]),
                             executor=str(values["executor"]), profile=str(values["profile"]))

    return make


@pytest.fixture(scope="session")
def thinking_hf(tiny_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint with a Qwen3-like hybrid chat template: it reads `enable_thinking` and
    thinks by default (tiny_hf.THINKING_CHAT_TEMPLATE)."""
    from ggpo_batch.train.task.tiny_hf import THINKING_CHAT_TEMPLATE, with_chat_template

    return with_chat_template(tiny_hf, tmp_path_factory.mktemp("thinking-hf") / "model", THINKING_CHAT_TEMPLATE)
