"""The question-answering task: items, prompt templates, the corpus, and the verifier.

Two sources: `synthetic` (a small corpus of invented facts and questions this project generates,
deterministically, so every arm and seed sees the same data) and `jsonl` (local files on a
cluster; nothing is downloaded at run time). Some synthetic questions are deliberately
*unsupported*: their fact is left out of the corpus, so a gold answer cannot be verified.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from .config import TrainConfig

log = logging.getLogger(__name__)

TEMPLATES = {
    "train": "Question: {question}\nAnswer:",
    "train_direct": "Q: {question}\nA:",
    "train_role": "You are a careful librarian. Question: {question}\nAnswer:",
    "eval": "Question: {question}\nAnswer:",
}

_SYLLABLES = ("ka", "zo", "ri", "mel", "tun", "vo", "sha", "dra", "ne", "pul", "quo", "bex", "lin", "tor")
_RELATIONS = (
    ("capital", "The capital of {e} is {v}.", "What is the capital of {e}?"),
    ("river", "The longest river of {e} is the {v}.", "Which is the longest river of {e}?"),
    ("founder", "{e} was founded by {v}.", "Who founded {e}?"),
)


@dataclass(frozen=True)
class Item:
    """One question with its gold answer and the title of the passage that supports it."""

    item_id: str
    question: str
    answer: str
    support_title: str


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass(frozen=True)
class TaskData:
    train: tuple[Item, ...]
    heldout: tuple[Item, ...]  # evaluation items; exposure arms draw from these
    corpus: tuple[Passage, ...]


def render(template: str, item: Item) -> str:
    return TEMPLATES[template].format(question=item.question)


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def reward(answer: str, gold: str) -> float:
    """The verifier: 1.0 if the normalised gold answer occurs in the answer, else 0.5 x the
    character F1 of the two without spaces (a dense signal a tiny policy can climb)."""
    a, g = normalize(answer), normalize(gold)
    if g and g in a:
        return 1.0
    ab, gb = a.replace(" ", ""), g.replace(" ", "")
    if not ab or not gb:
        return 0.0
    pool = list(gb)
    common = 0
    for b in ab:
        if b in pool:
            pool.remove(b)
            common += 1
    if common == 0:
        return 0.0
    p, r = common / len(ab), common / len(gb)
    return 0.5 * 2 * p * r / (p + r)


def is_clean_answer(gold: str) -> bool:
    """A gold answer usable as a supervised target as-is: short, plain words, stable under normalisation."""
    return 0 < len(gold) <= 24 and normalize(gold) == gold.lower() and gold.strip() == gold


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(parts)).capitalize()


def synthetic(cfg: TrainConfig, data_seed: int = 0) -> TaskData:
    """Invented entities and facts; the same for every arm and seed (data_seed is fixed)."""
    rng = random.Random(data_seed)
    entities: list[str] = []
    while len(entities) < cfg.synthetic_entities:
        name = _name(rng, 2)
        if name not in entities:
            entities.append(name)
    items: list[Item] = []
    corpus: list[Passage] = []
    for i, ent in enumerate(entities):
        key, fact, question = _RELATIONS[i % len(_RELATIONS)]
        value = _name(rng, 2)
        title = f"{ent} ({key})"
        items.append(Item(f"syn-{i:04d}", question.format(e=ent), value, title))
        if rng.random() >= cfg.synthetic_unsupported_fraction:
            corpus.append(Passage(title, fact.format(e=ent, v=value)))
        # Distractor passages mention the entity without the answer.
        corpus.append(Passage(f"{ent} (notes)", f"{ent} is a place of {_name(rng, 1).lower()} traders."))
    rng.shuffle(items)
    n_eval = min(cfg.synthetic_eval_items, len(items) - 1)
    return TaskData(train=tuple(items[n_eval:]), heldout=tuple(items[:n_eval]), corpus=tuple(corpus))


def _read_jsonl(path: str, field: str, spec_path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(spec_path, f"train.{field}", f"{path} is not a readable file")
    rows = []
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise SpecError(spec_path, f"train.{field}", f"{path}:{n}: bad JSON ({exc.msg})") from None
    return rows


def from_jsonl(cfg: TrainConfig, spec_path: str = "<run spec>") -> TaskData:
    """Real data from local files: items {"question","answer","support_title"[,"id"]}, corpus {"title","text"}."""

    def items(field: str) -> tuple[Item, ...]:
        out = []
        for n, row in enumerate(_read_jsonl(getattr(cfg, field), field, spec_path)):
            try:
                out.append(Item(str(row.get("id", f"{field}-{n}")), row["question"], row["answer"],
                                row.get("support_title", "")))
            except KeyError as exc:
                raise SpecError(spec_path, f"train.{field}", f"line {n + 1} lacks {exc.args[0]!r}") from None
        return tuple(out)

    corpus = tuple(Passage(r["title"], r["text"]) for r in _read_jsonl(cfg.corpus_path, "corpus_path", spec_path))
    return TaskData(train=items("train_path"), heldout=items("eval_path"), corpus=corpus)


def load(cfg: TrainConfig) -> TaskData:
    data = synthetic(cfg) if cfg.task == "synthetic" else from_jsonl(cfg)
    log.info("task %s: %d train, %d held-out items, %d passages", cfg.task, len(data.train), len(data.heldout),
             len(data.corpus))
    return data
