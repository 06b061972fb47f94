"""`[train.task] kind` and `[train.data]` in JSONL or Parquet (train/task/datafile.py, items.py): the task's
rules against the rest of `[train]`, column mapping, verl's layout read as it is, and the rules every
JSONL file is held to, held for Parquet too (sizes from the footer before reading, a row's index named)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from ggpo_batch.errors import SpecError  # noqa: E402
from ggpo_batch.spec.parse import parse_spec  # noqa: E402
from ggpo_batch.train.config import TrainConfig  # noqa: E402
from ggpo_batch.train.task import datafile  # noqa: E402
from ggpo_batch.train.task.items import read_items  # noqa: E402

ST = {"task": {"kind": "single_turn"}, "data": {"train": "t.parquet", "eval": "e.parquet"}}


def verl_rows(n: int, start: int = 0) -> list[dict]:
    return [{"data_source": "arith", "prompt": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"index": i, "split": "train"}} for i in range(start, start + n)]


def write_parquet(path: Path, rows: list[dict], **kw) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path, **kw)
    return str(path)


def test_single_turn_has_one_turn_no_tool_no_passages_and_reads_data_files() -> None:
    cfg = TrainConfig.from_table(ST, "j.toml")
    assert (cfg.kind, cfg.max_turns) == ("single_turn", 1)
    for table, field in [({**ST, "max_turns": 2}, "train.max_turns"),
                         ({**ST, "retrieval_top_k": 3}, "train.retrieval_top_k"),
                         ({**ST, "data": {**ST["data"], "passages": "p.jsonl"}}, "train.data.passages"),
                         ({"task": {"kind": "single_turn"}}, "train.data"),
                         ({"data": {"train": "t", "eval": "e"}}, "train.data.passages"),  # retrieval QA needs them
                         ({**ST, "task": {"kind": "multi"}}, "train.task.kind"),
                         ({**ST, "task": {"reward": ["math", "math"]}}, "train.task.reward"),
                         ({**ST, "task": {"reward": "nope"}}, "train.task.reward"),
                         ({**ST, "task": {"reward": ["math", "exact_match"], "reward_weights": [1]}},
                          "train.task.reward_weights"),
                         ({**ST, "data": {**ST["data"], "columns": {"questin": "q"}}}, "train.data.columns.questin")]:
        with pytest.raises(SpecError) as err:
            TrainConfig.from_table(table, "j.toml")
        assert err.value.field == field, (table, err.value)


def test_exposure_arms_are_refused_outside_retrieval_qa(tmp_path: Path) -> None:
    spec = {"experiment": {"name": "t", "method": "ggpo", "seeds": [1], "executor": "local"},
            "arms": {"clean": {}, "paired": {"exposure": "paired", "exposed_items": 2, "templates": ["train"]}},
            "train": ST}
    with pytest.raises(SpecError) as err:
        parse_spec(spec, str(tmp_path / "s.toml"))
    assert err.value.field == "arms.paired.exposure" and "retrieval_qa" in err.value.problem
    spec["arms"] = {"clean": {}}
    assert parse_spec(spec, str(tmp_path / "s.toml")).train["task"] == {"kind": "single_turn"}


def test_a_spec_without_the_new_keys_keeps_its_train_table() -> None:
    table = {"data": {"train": "/t.jsonl", "eval": "/e.jsonl", "passages": "/p.jsonl"}, "lr": 0.01}
    out = TrainConfig.from_table(table, "j.toml").to_table()
    assert "task" not in out and set(out["data"]) == {"train", "eval", "passages"}


def test_verls_parquet_layout_is_read_as_it_is(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", verl_rows(3))
    items = read_items(path, "train.data.train", kind="single_turn")
    it = items[1]
    assert (it.item_id, it.answers, it.prompt) == ("1", ("2",), (("user", "What is 1 + 1?"),))
    assert it.prompt_value() == [{"role": "user", "content": "What is 1 + 1?"}]
    cols = it.reward_columns()
    assert "prompt" not in cols and cols["reward_model"]["ground_truth"] == "2" and cols["ability"] == "math"


def test_single_turn_jsonl_with_text_prompts_answer_and_mapped_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"qid": f"q{i}", "text": f"{i}*2=", "answer": 2 * i}) + "\n" for i in range(3)))
    items = read_items(str(path), "train.data.train", kind="single_turn", columns={"id": "qid", "prompt": "text"})
    assert [(i.item_id, i.prompt, i.answers) for i in items][2] == ("q2", "2*2=", ("4",))
    # Without an id column: the row's place in its file, apart for train and eval.
    path.write_text(json.dumps({"prompt": "x", "answers": ["1", "one"]}) + "\n")
    assert read_items(str(path), "train.data.eval", kind="single_turn")[0].item_id == "eval-0"
    with pytest.raises(SpecError, match=r"t.jsonl:1: lacks the gold answer \('gold'\)"):
        read_items(str(path), "train.data.train", kind="single_turn", columns={"answers": "gold"})


def test_retrieval_items_read_from_parquet_with_renamed_columns(tmp_path: Path) -> None:
    rows = [{"qid": i, "query": f"who {i}?", "answers": ["a"], "support_titles": []} for i in range(2)]
    path = write_parquet(tmp_path / "t.parquet", rows)
    items = read_items(path, "train.data.train", columns={"id": "qid", "question": "query"})
    assert [(i.item_id, i.question) for i in items] == [("0", "who 0?"), ("1", "who 1?")]
    with pytest.raises(SpecError, match=r"t.parquet: row 0: lacks 'id', 'question'"):
        read_items(path, "train.data.train")


@pytest.mark.parametrize("case", ["row_group", "nan", "type", "damaged", "suffix", "repeat", "prompt", "deep", "footer",
                                  "truncated"])
def test_hostile_parquet_files_are_refused_in_one_line_naming_the_row(tmp_path: Path, case: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.parquet"
    rows = verl_rows(4)
    words = {"row_group": "row group 0 holds", "nan": "row 2: at extra_info.score: ",
             "type": "column 'when' has type timestamp", "damaged": "is not a readable Parquet file",
             "suffix": "is JSONL", "repeat": "row 3: id 1 repeats row 1", "prompt": "row 0: prompt must be text or",
             "deep": "nested over 32 deep", "footer": "its footer (the schema and row-group metadata) is",
             "truncated": "is not a Parquet file (no PAR1 at its end)"}[case]
    if case == "row_group":
        monkeypatch.setattr(datafile, "PARQUET_ROW_GROUP_MAX_BYTES", 100)
        write_parquet(path, rows)
    elif case == "nan":
        for i, r in enumerate(rows):
            r["extra_info"]["score"] = float("nan") if i == 2 else 1.0
        write_parquet(path, rows)
    elif case == "type":
        import datetime

        write_parquet(path, [{**r, "when": datetime.datetime(2026, 1, 1)} for r in rows])
    elif case == "damaged":
        write_parquet(path, rows)
        raw = path.read_bytes()
        path.write_bytes(raw[:-60] + b"\xff" * 52 + raw[-8:])  # a footer of garbage, its length and magic kept
    elif case == "truncated":
        write_parquet(path, rows)
        path.write_bytes(path.read_bytes()[:-20])
    elif case == "suffix":
        path = tmp_path / "t.csv"
        path.write_text("a,b\n")
    elif case == "repeat":
        rows[3]["extra_info"]["index"] = 1
        write_parquet(path, rows)
    elif case == "prompt":
        rows[0]["prompt"] = [{"role": "user", "content": 3}]
        pq.write_table(pa.Table.from_pylist([rows[0]]), path)
    elif case == "footer":
        monkeypatch.setattr(datafile, "PARQUET_FOOTER_MAX_BYTES", 64)
        write_parquet(path, rows)
    elif case == "deep":
        value: object = 1
        for _ in range(40):
            value = [value]
        write_parquet(path, [{**r, "deep": value} for r in rows])
    with pytest.raises(SpecError) as err:
        read_items(str(path), "train.data.train", "j.toml", kind="single_turn")
    assert err.value.field == "train.data.train" and str(path) in err.value.problem
    assert words in err.value.problem and "\n" not in str(err.value), err.value.problem


def test_parquet_is_read_one_row_group_at_a_time(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "t.parquet", verl_rows(10), row_group_size=3)
    assert pq.ParquetFile(path).metadata.num_row_groups == 4
    assert [i.item_id for i in read_items(path, "train.data.train", kind="single_turn")] == [str(i) for i in range(10)]


@pytest.mark.parametrize("name, run_key, pinned", [
    ("demo-cpu", "demo-cpu-v1-1-clean", "cb61b73b00902421d0ceaadb0c1be159c81b392cb1d932184310ff70c9520b79"),
    ("exposure-5arm", "exposure-5arm-v1-20261012-clean",
     "6c3d603b61d0afe3d19d74f1b97da0db42f97606e19360367b140218217ac6d6"),
])
def test_runs_of_specs_without_the_task_keys_keep_their_config_hashes(name: str, run_key: str, pinned: str) -> None:
    """The spec hashes are pinned in tests/test_baseline.py; these are the config hashes of the release
    before [train.task] (the same file on that commit gives them)."""
    from ggpo_batch.contracts.runspec import config_hash
    from ggpo_batch.spec.parse import load_spec

    run = load_spec(Path(__file__).resolve().parents[2] / "jobs" / f"{name}.toml").expand(1)[0]
    assert (run.run_key, config_hash(run.to_dict())) == (run_key, pinned)


def test_the_arithmetic_set_is_generated_deterministically_in_verls_layout(tmp_path: Path) -> None:
    from ggpo_batch.train.task.arithmetic import rows, write

    assert rows(8, seed=3) == rows(8, seed=3) != rows(8, seed=4)
    files = write(tmp_path, n_train=6, n_eval=3)
    train = read_items(str(files["train"]), "train.data.train", kind="single_turn")
    held = read_items(str(files["eval"]), "train.data.eval", kind="single_turn")
    assert [i.item_id for i in held] == ["6", "7", "8"] and len(train) == 6
    a, b, op = train[0].question.rsplit("What is ", 1)[1].rstrip("?").split(" ")[0::2] + \
        [train[0].question.rsplit("What is ", 1)[1].split(" ")[1]]
    assert train[0].answers == (str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]),)
