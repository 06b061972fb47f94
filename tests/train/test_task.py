import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.errors import SpecError
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.task import qa as task
from ggpo_batch.train.task.retrieval import Retriever


def test_synthetic_is_deterministic_and_has_unsupported_items():
    cfg = TrainConfig()
    a, b = task.synthetic(cfg), task.synthetic(cfg)
    assert a == b
    assert len(a.heldout) == cfg.synthetic_eval_items
    assert not {i.item_id for i in a.train} & {i.item_id for i in a.heldout}
    titles = {p.title for p in a.corpus}
    unsupported = [i for i in a.train + a.heldout if i.support_title not in titles]
    assert 0 < len(unsupported) < len(a.train + a.heldout)


def test_bm25_finds_the_supporting_passage():
    data = task.synthetic(TrainConfig())
    r = Retriever(data.corpus)
    titles = {p.title for p in data.corpus}
    item = next(i for i in data.train if i.support_title in titles)
    hits = r.search(item.question + " " + item.support_title, 3)
    assert item.support_title in [p.title for p in hits]
    assert r.search("!!!", 3) == []


def test_reward_exact_partial_and_zero():
    assert task.reward("It is Meltrun.", "Meltrun") == 1.0
    assert 0 < task.reward("meltxx", "Meltrun") < 0.5
    assert task.reward("", "Meltrun") == 0.0
    assert task.is_clean_answer("Meltrun") and not task.is_clean_answer(" Mel-trun")


def test_data_files_load_in_the_documented_format(tmp_path):
    def write(name, rows):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / name)

    def item(i):
        return {"id": i, "question": f"Who wrote play {i}?", "answers": ["Shakespeare", "W. Shakespeare"],
                "support_titles": ["Hamlet", "Shakespeare"]}

    cfg = TrainConfig.from_table({"data": {"train": write("t.jsonl", [item(1), item(2), item(3)]),
                                           "eval": write("e.jsonl", [item(9)]),
                                           "passages": write("p.jsonl", [{"title": "Hamlet", "text": "by Shakespeare"}])}},
                                 "j.toml")
    data = task.load(cfg)
    assert (len(data.train), len(data.heldout), data.corpus[0].title) == (3, 1, "Hamlet")
    it = data.heldout[0]
    assert (it.item_id, it.answers, it.support_titles, it.answer) == ("9", ("Shakespeare", "W. Shakespeare"),
                                                                      ("Hamlet", "Shakespeare"), "Shakespeare")
    # Any gold answer counts: the verifier takes the best.
    assert task.score("W. Shakespeare", it) == 1.0 and task.score("nobody", it) < 1.0


@pytest.mark.parametrize("rows, words", [
    ([{"question": "x"}], "lacks 'id', 'answers', 'support_titles'"),
    ([{"id": 1, "question": "x", "answers": [], "support_titles": []}], "answers must be a non-empty array"),
    ([{"id": 1, "question": "", "answers": ["a"], "support_titles": []}], "question must be a non-empty string"),
    ([{"id": 1, "question": "x", "answers": ["a"], "support_titles": "T"}], "support_titles must be an array"),
    ([{"id": 1, "question": "x", "answers": ["a"], "support_titles": []}] * 2, "id 1 repeats line 1"),
    (["[1]"], "must be a JSON object"),
])
def test_bad_data_lines_name_the_field_file_and_line(tmp_path, rows, words):
    path = tmp_path / "t.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    with pytest.raises(SpecError) as err:
        task.read_items(str(path), "train.data.train", "j.toml")
    assert err.value.field == "train.data.train" and words in err.value.problem and str(path) + ":" in err.value.problem


def test_held_out_ids_may_not_be_in_train(tmp_path):
    row = {"id": "a", "question": "x", "answers": ["y"], "support_titles": []}
    for name in ("t", "e"):
        (tmp_path / f"{name}.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "p.jsonl").write_text(json.dumps({"title": "T", "text": "y"}) + "\n")
    cfg = TrainConfig.from_table({"data": {k: str(tmp_path / f"{f}.jsonl") for k, f in
                                           (("train", "t"), ("eval", "e"), ("passages", "p"))}}, "j.toml")
    with pytest.raises(SpecError, match="train.data.eval: 1 id.* also in train"):
        task.load(cfg)
