"""A task's items and passages, and how they are read from `[train.data]` files (datafile.py reads the
rows, JSONL or Parquet; this module maps their columns to an item's fields, per task kind).

Retrieval QA: `id`, `question`, `answers` (array of strings), `support_titles` (array of strings).
Single turn: `id`, `prompt` (text, or a chat: an array of {"role", "content"}), `answers` (a string, a
number or an array of them; `answer`, then verl's `reward_model.ground_truth`, where the file has no
`answers`). `[train.data.columns]` renames any of them; a dotted name reads a nested field. Every
other column is kept for a user's reward, which TRL-style gets each column as a keyword argument.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..task_config import RETRIEVAL_QA, SINGLE_TURN
from .datafile import DataFileError, column, rows

# Where a single-turn file has no `answers` column: these, in order (TRL's and verl's layouts).
ANSWER_FALLBACKS = ("answers", "answer", "reward_model.ground_truth")
# Where a single-turn file has no `id` column: verl's index, else the row's place in its file.
ID_FALLBACKS = ("id", "extra_info.index")


@dataclass(frozen=True)
class Item:
    """One question, its gold answers (any one counts) and the titles of the passages that support
    it (several for a multi-hop question; none for an unsupported one). A single-turn item carries its
    `prompt` as given (text, or a chat as ((role, content), ...)); a retrieval one has None and is
    shown through a template. `columns` is its data row as JSON (a user reward's keywords)."""

    item_id: str
    question: str
    answers: tuple[str, ...]
    support_titles: tuple[str, ...] = ()
    prompt: str | tuple[tuple[str, str], ...] | None = None
    columns: str = ""

    @property
    def answer(self) -> str:
        """The canonical gold answer: the first (the auxiliary loss's target)."""
        return self.answers[0]

    @property
    def support_title(self) -> str:
        return self.support_titles[0] if self.support_titles else ""

    @property
    def single_turn(self) -> bool:
        return self.prompt is not None

    def prompt_value(self) -> Any:
        """The prompt as a reward function is given it: text, or a list of {"role", "content"} messages."""
        if self.prompt is None:
            return self.question
        if isinstance(self.prompt, str):
            return self.prompt
        return [{"role": r, "content": c} for r, c in self.prompt]

    def reward_columns(self) -> dict[str, Any]:
        """The item's data row (without its prompt) as a reward's keywords; its fields for a generated item."""
        if self.columns:
            return json.loads(self.columns)
        return {"id": self.item_id, "question": self.question, "answers": list(self.answers),
                "support_titles": list(self.support_titles)}


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


def _str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) and x.strip() for x in value)


def _pick(row: dict[str, Any], name: str | None, fallbacks: tuple[str, ...]) -> tuple[str | None, Any]:
    """(the column used, its value) for a field mapped to `name`, else the first fallback the row has."""
    for candidate in ((name,) if name else fallbacks):
        found, value = column(row, candidate)
        if found:
            return candidate, value
    return None, None


def read_items(path: str, field: str, spec_path: str = "<run spec>", *, kind: str = RETRIEVAL_QA,
               columns: Mapping[str, str] | None = None) -> tuple[Item, ...]:
    """Items of a `[train.data]` train/eval file (JSONL or Parquet) for a task of `kind`."""
    columns = dict(columns or {})
    out: list[Item] = []
    seen: dict[str, str] = {}
    role = field.rpartition(".")[2]
    for n, (where, place, row) in enumerate(rows(path, field, spec_path)):
        def bad(problem: str) -> DataFileError:
            return DataFileError(spec_path, field, f"{where}: {problem}")  # noqa: B023 (raised at once)

        item = (_retrieval_item if kind == RETRIEVAL_QA else _single_turn_item)(row, columns, bad, f"{role}-{n}")
        if item.item_id in seen:
            raise bad(f"id {_shown_id(row, columns, item.item_id)!r} repeats {seen[item.item_id]}")
        seen[item.item_id] = place
        out.append(item)
    if not out:
        raise DataFileError(spec_path, field, f"{path} holds no item")
    return tuple(out)


def _shown_id(row: dict[str, Any], columns: Mapping[str, str], item_id: str) -> Any:
    _, value = _pick(row, columns.get("id"), ID_FALLBACKS)
    return value if value is not None else item_id


def _item_id(value: Any, bad: Any, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise bad(f"{name} must be a non-empty string or an integer")
    return str(value)


def _retrieval_item(row: dict[str, Any], columns: Mapping[str, str], bad: Any, _: str) -> Item:
    names = {k: columns.get(k, k) for k in ("id", "question", "answers", "support_titles")}
    values = {k: column(row, c) for k, c in names.items()}
    missing = [names[k] for k, (found, _v) in values.items() if not found]
    if missing:
        raise bad(f"lacks {', '.join(repr(k) for k in missing)}")
    item_id = _item_id(values["id"][1], bad, "id" if names["id"] == "id" else f"id (column {names['id']!r})")
    question, answers, titles = values["question"][1], values["answers"][1], values["support_titles"][1]
    if not isinstance(question, str) or not question.strip():
        raise bad(f"{names['question']} must be a non-empty string")
    if not _str_list(answers) or not answers:
        raise bad(f"{names['answers']} must be a non-empty array of non-empty strings")
    if not _str_list(titles):
        raise bad(f"{names['support_titles']} must be an array of non-empty strings")
    return Item(item_id, question, tuple(answers), tuple(titles))


def _single_turn_item(row: dict[str, Any], columns: Mapping[str, str], bad: Any, fallback_id: str) -> Item:
    id_column, id_value = _pick(row, columns.get("id"), ID_FALLBACKS)
    if id_column is None and "id" in columns:
        raise bad(f"lacks {columns['id']!r}")
    item_id = fallback_id if id_column is None else _item_id(id_value, bad, id_column)
    prompt_column = columns.get("prompt", "prompt")
    found, prompt = column(row, prompt_column)
    if not found:
        raise bad(f"lacks {prompt_column!r} (the prompt: text or a chat)")
    answer_column, answers = _pick(row, columns.get("answers"), ANSWER_FALLBACKS)
    if answer_column is None:
        wanted = [columns["answers"]] if "answers" in columns else list(ANSWER_FALLBACKS)
        raise bad(f"lacks the gold answer ({' or '.join(repr(c) for c in wanted)})")
    if isinstance(prompt, str):
        if not prompt.strip():
            raise bad(f"{prompt_column} must be non-empty text or a chat")
        shown: str | tuple[tuple[str, str], ...] = prompt
        question = prompt
    elif isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        shown = tuple((m["role"], m["content"]) for m in prompt)
        question = "\n".join(c for _, c in shown)
    else:
        raise bad(f"{prompt_column} must be text or a non-empty array of {{\"role\", \"content\"}} messages (strings)")
    gold = answers if isinstance(answers, list) else [answers]
    if not gold or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in gold):
        raise bad(f"{answer_column} must be a string, a number or a non-empty array of them")
    gold_text = tuple(str(a) for a in gold)
    if not all(a.strip() for a in gold_text):
        raise bad(f"{answer_column} must not be empty")
    kept = {k: v for k, v in row.items() if k != prompt_column}
    return Item(item_id, question, gold_text, (), prompt=shown, columns=json.dumps(kept, sort_keys=True))


def read_passages(path: str, field: str, spec_path: str = "<run spec>") -> tuple[Passage, ...]:
    """Passages of a `[train.data]` passages file: {"title", "text"} per row."""
    out = []
    for where, _place, row in rows(path, field, spec_path):
        title, text = row.get("title"), row.get("text")
        if not isinstance(title, str) or not title.strip() or not isinstance(text, str):
            raise DataFileError(spec_path, field, f"{where}: needs \"title\" (a non-empty string) and \"text\" "
                                f"(a string)")
        out.append(Passage(title, text))
    if not out:
        raise DataFileError(spec_path, field, f"{path} holds no passage")
    return tuple(out)


__all__ = ["SINGLE_TURN", "Item", "Passage", "read_items", "read_passages"]
