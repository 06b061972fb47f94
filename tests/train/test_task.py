import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("bm25s")
pytestmark = pytest.mark.train

from ggpo_batch.errors import SpecError
from ggpo_batch.train import task
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.retrieval import Retriever


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


def test_jsonl_task_loads_local_files(tmp_path):
    def write(name, rows):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / name)

    q = {"question": "Who wrote Hamlet?", "answer": "Shakespeare", "support_title": "Hamlet"}
    cfg = TrainConfig.from_table({"task": "jsonl", "train_path": write("t.jsonl", [q] * 3),
                                  "eval_path": write("e.jsonl", [q]),
                                  "corpus_path": write("c.jsonl", [{"title": "Hamlet", "text": "by Shakespeare"}])},
                                 "j.toml")
    data = task.load(cfg)
    assert (len(data.train), len(data.heldout), data.corpus[0].title) == (3, 1, "Hamlet")
    write("t.jsonl", [{"question": "x"}])
    with pytest.raises(SpecError, match="train.train_path: line 1 lacks 'answer'"):
        task.load(cfg)
