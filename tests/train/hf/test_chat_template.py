"""Chat templates with a thinking mode: `[train.model] chat_template_kwargs` reaches every rendered
prompt (training, evaluation, the weight-sync probe, preflight's measurements), and preflight refuses
a thinking switch left at its default, a keyword the template never reads, and a prompt that ends
inside an open reasoning block (exit 2, one line naming the keyword)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.pretrained import chat_template
from ggpo_batch.train.task.tiny_hf import (
    ALWAYS_THINKING_CHAT_TEMPLATE,
    CHAT_TEMPLATE,
    THINKING_CHAT_TEMPLATE,
    with_chat_template,
)

FIELD = "train.model.chat_template_kwargs"
CLOSED_EMPTY_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def write_spec(write, model: Path, kwargs: str = "") -> Path:  # type: ignore[no-untyped-def]
    """The conftest's spec for `model`, with `chat_template_kwargs = kwargs` in [train.model] when given."""
    return write(name="think", model=model, model_extra=f"chat_template_kwargs = {kwargs}" if kwargs else "")


def test_the_template_variables_come_from_parsing_its_jinja_source():
    assert {"messages", "add_generation_prompt", "enable_thinking"} <= chat_template.template_variables(
        THINKING_CHAT_TEMPLATE)
    assert "enable_thinking" not in chat_template.template_variables(CHAT_TEMPLATE)
    # transformers' own tags and loop controls parse; a variable set inside the template is not read.
    source = ("{% set thinking = true %}{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}"
              "{% break %}{% endfor %}{{ thinking }}{{ reasoning_effort }}")
    assert chat_template.template_variables(source) == {"messages", "reasoning_effort"}
    assert chat_template.open_reasoning_tag("x<think>\n") == "<think>"
    assert chat_template.open_reasoning_tag("x<think>\n\n</think>\n\n") is None
    assert chat_template.open_reasoning_tag("<think>a</think>[THINK]") == "[THINK]"


@pytest.mark.parametrize(("value", "words"), [
    ("false", None),
    ("{ enable_thinking = 0 }", "must be true or false, got 0"),
    ("{ tokenize = true }", "is an argument of apply_chat_template itself"),
    ("{ budget = [1, 2] }", "must be true/false, a number or a string"),
    ("{ enable_thinking = false, reasoning_effort = \"low\", budget = 512, temperature = 0.5 }", ""),
])
def test_the_config_takes_a_table_of_scalar_keywords(value: str, words: str | None):
    import tomllib

    table = {"model": {"path": "m", "chat_template_kwargs": tomllib.loads(f"v = {value}")["v"]}}
    if words == "":
        cfg = TrainConfig.from_table(table, "s.toml")
        assert cfg.model.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low", "budget": 512,
                                                  "temperature": 0.5}
        assert TrainConfig.from_table(cfg.to_table(), "s.toml") == cfg
        return
    with pytest.raises(SpecError) as err:
        TrainConfig.from_table(table, "s.toml")
    assert err.value.field.startswith(FIELD) and (words is None or words in err.value.problem)


def test_the_accepted_spec_renders_the_closed_empty_think_block(write, thinking_hf):  # type: ignore[no-untyped-def]
    """enable_thinking = false: preflight passes, and the prompt it measured (as training renders it)
    ends with Qwen3's empty reasoning block after the generation prompt, the tokens included."""
    report = preflight.check(load_spec(write_spec(write, thinking_hf, "{ enable_thinking = false }")))
    assert report.ok, report.lines()
    left = preflight.check(load_spec(write_spec(write, thinking_hf)))
    codec = _codec(thinking_hf, {"enable_thinking": False})
    assert codec.chat_text(codec.user_message("Where?")).endswith(CLOSED_EMPTY_THINK)
    block = len(codec.tokenizer("<think>\n\n</think>\n\n", add_special_tokens=False)["input_ids"])
    # Preflight's prompt lengths are those of the kwargs' prompts: the block's tokens longer.
    assert report.facts["longest_prompt_tokens"] == left.facts["longest_prompt_tokens"] + block > block > 0


@pytest.mark.parametrize(("case", "words"), [
    ("switch left at its default", "thinking switch `enable_thinking` that the spec leaves at its default"),
    ("keyword never read", ("`reasoning_budget` is never read by the chat template (the keywords it reads: "
                            "enable_thinking); remove it")),
    ("open reasoning block", "the rendered prompt ends inside an open <think> reasoning block"),
])
def test_preflight_refuses_each_template_problem_in_one_line(case, words, write, tmp_path, tiny_hf, thinking_hf):  # type: ignore[no-untyped-def]
    if case == "switch left at its default":
        path = write_spec(write, thinking_hf)
    elif case == "keyword never read":
        path = write_spec(write, thinking_hf, "{ enable_thinking = false, reasoning_budget = 3 }")
    else:
        model = with_chat_template(tiny_hf, tmp_path / "always", ALWAYS_THINKING_CHAT_TEMPLATE)
        path = write_spec(write, model)
    report = preflight.check(load_spec(path))
    assert [p.field for p in report.problems] == [FIELD], report.lines()
    [line] = report.lines()
    assert line.startswith(f"{path}: {FIELD}: ") and words in line and "\n" not in line
    with pytest.raises(preflight.PreflightError) as err:
        preflight.require(load_spec(path))
    assert err.value.exit_code == 2 and err.value.lines == [line]


def test_train_refuses_a_thinking_template_left_at_its_default_with_exit_2(write, tmp_path, thinking_hf):  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    path = write_spec(write, thinking_hf)
    res = CliRunner().invoke(cli, ["train", str(path), "--arm", "clean", "--seed", "7", "-o", str(tmp_path / "r.json")],
                             catch_exceptions=False)
    assert res.exit_code == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: {FIELD}: ") and "`enable_thinking`" in line
    assert not (tmp_path / "r.json").exists()


def _codec(model: Path, kwargs: dict):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.task.codec import make_codec

    cfg = TrainConfig.from_table({"model": {"path": str(model), "chat_template_kwargs": kwargs}}, "t")
    return make_codec(cfg)


@pytest.mark.train
@pytest.mark.slow
def test_training_evaluation_and_probe_prompts_carry_the_kwargs(one_rank, hf_spec, thinking_hf):  # type: ignore[no-untyped-def]
    """The trainer's codec renders every prompt with the spec's keywords: a step's rollouts, the
    evaluation's prompts and the weight-sync probe's sequence all hold the closed empty think block."""
    import dataclasses

    import torch

    from ggpo_batch.train.run.evaluation import EVAL_TEMPLATE
    from ggpo_batch.train.run.trainer import Trainer
    from ggpo_batch.train.run.weight_sync import probe_sequence

    spec = hf_spec("clean", budget=1e9)
    model = {**spec.train["model"], "path": str(thinking_hf), "chat_template_kwargs": {"enable_thinking": False}}
    spec = dataclasses.replace(spec, train={**spec.train, "model": model})
    cfg = TrainConfig.from_table(spec.train, "t")
    trainer = Trainer(spec, cfg, rank=0, world=1, device=torch.device("cpu"), budget_seconds=1e9)
    try:
        tok = trainer.codec.tokenizer
        text = [tok.decode(t.tokens) for ts in trainer._rollouts(trainer.curriculum.step_groups(0), 0) for t in ts]
        assert text and all(CLOSED_EMPTY_THINK in t for t in text)
        item = trainer.data.heldout[0]
        assert tok.decode(trainer.codec.prompt(EVAL_TEMPLATE, item)).endswith(CLOSED_EMPTY_THINK)
        probe = tok.decode(probe_sequence(trainer.codec, trainer.data.train[:1], limit=10_000))
        assert CLOSED_EMPTY_THINK in probe
    finally:
        trainer.close()
