"""The question-answering task: items, prompt templates, the corpus, and the verifier.

Two sources: the generated corpus (a small corpus of invented facts and questions this project
generates, deterministically, so every arm and seed sees the same data; used without
`[train.data]`) and `[train.data]` files (JSONL on the cluster's file system, see docs/researcher.md; nothing is
downloaded at run time). Some synthetic questions are deliberately
*unsupported*: their fact is left out of the corpus, so a gold answer cannot be verified.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass

from ...errors import SpecError
from ..config import TrainConfig
from ..task_config import SINGLE_TURN
from .datafile import DATA_LINE_MAX_BYTES, DataFileError
from .items import Item, Passage, read_items, read_passages

# Where these lived before items.py and datafile.py: their callers import them from here too.
__all__ = ["DATA_LINE_MAX_BYTES", "DataFileError", "Item", "Passage", "read_items", "read_passages"]

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
class TaskData:
    train: tuple[Item, ...]
    heldout: tuple[Item, ...]  # evaluation items; exposure arms draw from these
    corpus: tuple[Passage, ...]


def render(template: str, item: Item) -> str:
    """The prompt text of `item` through `template`; a single-turn item's own prompt text (no template)."""
    if item.single_turn:
        return item.question
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


def score(answer: str, item: Item) -> float:
    """The verifier's reward for `answer` against every gold answer of `item` (the best)."""
    return max(reward(answer, g) for g in item.answers)


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
        items.append(Item(f"syn-{i:04d}", question.format(e=ent), (value,), (title,)))
        if rng.random() >= cfg.synthetic_unsupported_fraction:
            corpus.append(Passage(title, fact.format(e=ent, v=value)))
        # Distractor passages mention the entity without the answer.
        corpus.append(Passage(f"{ent} (notes)", f"{ent} is a place of {_name(rng, 1).lower()} traders."))
    rng.shuffle(items)
    n_eval = min(cfg.synthetic_eval_items, len(items) - 1)
    return TaskData(train=tuple(items[n_eval:]), heldout=tuple(items[:n_eval]), corpus=tuple(corpus))


@dataclass(frozen=True)
class SupportCoverage:
    """How many items name a support title the passages file does not hold."""

    items_with_titles: int
    items_missing: int  # items naming at least one title that no passage has
    titles_found: int  # distinct named titles that a passage has

    @property
    def share_missing(self) -> float:
        return self.items_missing / self.items_with_titles if self.items_with_titles else 0.0

    def message(self) -> str:
        return (f"{self.items_missing} of {self.items_with_titles} items ({self.share_missing:.1%}) name a "
                f"support title that no passage has: retrieval cannot find their support")


def support_coverage(items: tuple[Item, ...], passages: tuple[Passage, ...]) -> SupportCoverage:
    """Items' support titles against the passages' titles. Some missing is normal (a corpus may leave a
    question unsupported on purpose, as the generated one does); none found at all means the passages
    file does not belong to the items (preflight refuses that)."""
    titles = {p.title for p in passages}
    named = [it for it in items if it.support_titles]
    missing = sum(1 for it in named if any(t not in titles for t in it.support_titles))
    found = len({t for it in named for t in it.support_titles} & titles)
    return SupportCoverage(len(named), missing, found)


def from_files(cfg: TrainConfig, spec_path: str = "<run spec>") -> TaskData:
    """The `[train.data]` files: train items, held-out (eval) items, passages; ids held out stay out of train."""
    data = cfg.data
    assert data is not None
    train = read_items(data.train, "train.data.train", spec_path, kind=cfg.kind, columns=data.columns)
    heldout = read_items(data.eval, "train.data.eval", spec_path, kind=cfg.kind, columns=data.columns)
    overlap = sorted({i.item_id for i in train} & {i.item_id for i in heldout})
    if overlap:
        raise SpecError(spec_path, "train.data.eval", f"{len(overlap)} id(s) are also in train ({overlap[0]!r}, ...): "
                        f"held-out items must be held out")
    if cfg.kind == SINGLE_TURN:
        return TaskData(train=train, heldout=heldout, corpus=())
    assert data.passages is not None
    corpus = read_passages(data.passages, "train.data.passages", spec_path)
    coverage = support_coverage(train + heldout, corpus)
    if coverage.items_missing:
        log.warning("train.data: %s", coverage.message())
    return TaskData(train=train, heldout=heldout, corpus=corpus)


def load(cfg: TrainConfig) -> TaskData:
    data = synthetic(cfg) if cfg.data is None else from_files(cfg)
    log.info("task %s: %d train, %d held-out items, %d passages", "synthetic" if cfg.data is None else "files",
             len(data.train), len(data.heldout), len(data.corpus))
    return data
