"""A single-turn item through a pretrained checkpoint's codec (train/task/codec.py): a chat prompt is the
chat template with the assistant turn opened, a text prompt is tokenized as it is (TRL's two prompt
forms, no tool instructions), and the reward sees the whole completion without its end of turn; preflight
measures single-turn prompts against max_model_len."""

from __future__ import annotations

import json
from pathlib import Path

from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.rollout.environment import completion_text
from ggpo_batch.train.task.codec import make_codec
from ggpo_batch.train.task.items import Item


def test_single_turn_prompts_and_completions_through_the_chat_template(tiny_hf: Path) -> None:
    cfg = TrainConfig.from_table({"model": {"path": str(tiny_hf), "dtype": "float32", "max_model_len": 512}}, "j")
    codec = make_codec(cfg)
    tok = codec.tokenizer
    chat = Item("a", "What is 2 + 2?", ("4",), prompt=(("user", "What is 2 + 2?"),))
    want = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
                                   add_generation_prompt=True)
    ids = codec.prompt("train", chat)
    assert ids == tok(want, add_special_tokens=False)["input_ids"]
    assert "<search>" not in tok.decode(ids)  # no tool instructions in a single-turn prompt
    text = Item("b", "2 + 2 =", ("4",), prompt="2 + 2 =")
    assert codec.prompt("train", text) == tok("2 + 2 =")["input_ids"]
    turn = tok("<answer>4</answer> so \\boxed{4}", add_special_tokens=False)["input_ids"] + [codec.eos_id]
    assert completion_text(chat, turn, codec) == tok.decode(turn[:-1], skip_special_tokens=True)
    retrieval = Item("c", "q?", ("4",))
    assert completion_text(retrieval, turn, codec) == "4"  # retrieval QA: the text inside <answer>
    # No search tool: `</search>` ends a retrieval turn, not a single-turn completion.
    search = tok("<search>x</search>", add_special_tokens=False)["input_ids"]
    assert codec.turn_ended(search)
    single = make_codec(TrainConfig.from_table({"model": cfg.to_table()["model"], "task": {"kind": "single_turn"},
                                                "data": {"train": "t", "eval": "e"}}, "j"))
    assert single.stop_strings == () and not single.turn_ended(search) and single.turn_ended(search + [single.eos_id])


def test_preflight_measures_single_turn_prompts(tiny_hf: Path, tmp_path: Path) -> None:
    from ggpo_batch.spec import preflight
    from ggpo_batch.spec.parse import load_spec

    rows = [{"id": i, "prompt": [{"role": "user", "content": "word " * (30 if i == 2 else 3)}], "answer": "4"}
            for i in range(4)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (tmp_path / "e.jsonl").write_text(json.dumps(rows[3]) + "\n")
    spec = tmp_path / "s.toml"
    spec.write_text(f"""[experiment]
name = "st"
method = "ggpo"
seeds = [1]
executor = "local"
gpus = 1
[arms.clean]
[train]
max_new_tokens = 8
[train.task]
kind = "single_turn"
reward = "exact_match"
[train.model]
path = "{tiny_hf}"
dtype = "float32"
max_model_len = 40
[train.data]
train = "t.jsonl"
eval = "e.jsonl"
""")
    report = preflight.check(load_spec(spec))
    assert [p.field for p in report.problems] == ["train.model.max_model_len"], report.lines()
    assert "item '2'" in report.problems[0].message and "1 x 8" in report.problems[0].message
