"""`[train.task]`: which task a run trains on and how its completions are rewarded, as a frozen,
validated dataclass (importable without torch, as the rest of `[train]`).

Two kinds: `retrieval_qa` (the search tool over the passages, several turns; today's and the
default) and `single_turn` (one prompt, one completion, no tool). The reward is one name or a list
of them, summed with `reward_weights`: a built-in (`BUILTIN_REWARDS`, train/task/rewards.py) or a
user's `FILE.py:FUNCTION`, whose path is made absolute from the spec's folder at enqueue.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..contracts import spec_fields
from ..errors import SpecError

KINDS: tuple[str, ...] = spec_fields.field("train.task.kind").choices
RETRIEVAL_QA, SINGLE_TURN = KINDS
BUILTIN_REWARDS = ("retrieval_qa", "exact_match", "token_f1", "math")
MAX_REWARDS = spec_fields.most("train.task.reward")
# `rewards/my_reward.py:score`: a Python file and a function name in it.
_USER_REWARD = re.compile(r"^(?P<file>[^:]+\.py):(?P<function>[A-Za-z_][A-Za-z0-9_]*)$")
# `[train]` keys that configure the search tool: refused outside retrieval QA.
RETRIEVAL_KEYS = ("retrieval_top_k", "passage_max_bytes")
# Task fields a data file's columns map to (`[train.data.columns]`), per kind.
COLUMN_FIELDS = {RETRIEVAL_QA: ("id", "question", "answers", "support_titles"),
                 SINGLE_TURN: ("id", "prompt", "answers")}


def user_reward(name: str) -> tuple[str, str] | None:
    """(file, function) of a user reward `FILE.py:FUNCTION`; None for a built-in's name."""
    m = _USER_REWARD.match(name)
    return (m["file"], m["function"]) if m else None


@dataclass(frozen=True)
class TaskConfig:
    """`[train.task]`: the task's kind, its rewards and their weights."""

    kind: str = spec_fields.default("train.task.kind")
    rewards: tuple[str, ...] = (spec_fields.default("train.task.reward"),)
    weights: tuple[float, ...] = (1.0,)
    reward_timeout_seconds: float = spec_fields.default("train.task.reward_timeout_seconds")

    @property
    def user_files(self) -> tuple[tuple[str, str], ...]:
        """(file, function) of each user reward, in the spec's order."""
        return tuple(u for u in map(user_reward, self.rewards) if u is not None)

    @classmethod
    def from_table(cls, table: Any, path: str) -> TaskConfig:
        if not isinstance(table, Mapping):
            raise SpecError(path, "train.task", "must be a table ([train.task])")
        known = spec_fields.keys("train.task")
        for key in table:
            if key not in known:
                raise SpecError(path, f"train.task.{key}", f"unknown key (known: {', '.join(sorted(known))})")
        kind = table.get("kind", cls.kind)
        if kind not in KINDS:
            raise SpecError(path, "train.task.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
        reward = table.get("reward", spec_fields.default("train.task.reward"))
        rewards = [reward] if isinstance(reward, str) else reward
        if not isinstance(rewards, list) or not rewards or not all(isinstance(r, str) for r in rewards):
            raise SpecError(path, "train.task.reward", "must be a reward's name or a non-empty array of them")
        if len(rewards) > MAX_REWARDS:
            raise SpecError(path, "train.task.reward", f"has {len(rewards)} rewards; at most {MAX_REWARDS}")
        for r in rewards:
            if r not in BUILTIN_REWARDS and user_reward(r) is None:
                raise SpecError(path, "train.task.reward", f"{r!r} is neither a built-in reward "
                                f"({', '.join(BUILTIN_REWARDS)}) nor FILE.py:FUNCTION")
        if len(set(rewards)) != len(rewards):
            raise SpecError(path, "train.task.reward", "names a reward twice")
        weights = table.get("reward_weights", [1.0] * len(rewards))
        if not isinstance(weights, list) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights):
            raise SpecError(path, "train.task.reward_weights", "must be an array of finite numbers")
        if len(weights) != len(rewards):
            raise SpecError(path, "train.task.reward_weights", f"has {len(weights)} weights for {len(rewards)} "
                            f"reward(s): one per reward")
        timeout = table.get("reward_timeout_seconds", cls.reward_timeout_seconds)
        f = spec_fields.field("train.task.reward_timeout_seconds")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise SpecError(path, "train.task.reward_timeout_seconds", f"must be a number, got {timeout!r}")
        problem = f.problem(timeout)
        if problem:
            raise SpecError(path, "train.task.reward_timeout_seconds", problem)
        return cls(kind=kind, rewards=tuple(rewards), weights=tuple(float(w) for w in weights),
                   reward_timeout_seconds=float(timeout))


def resolve_reward_paths(task: Mapping[str, Any], absolute: Any) -> dict[str, Any]:
    """The `[train.task]` table with each user reward's file made absolute by `absolute(path)`."""
    out = dict(task)
    reward = out.get("reward")

    def one(name: Any) -> Any:
        u = user_reward(name) if isinstance(name, str) else None
        return f"{absolute(u[0])}:{u[1]}" if u else name

    if isinstance(reward, str):
        out["reward"] = one(reward)
    elif isinstance(reward, list):
        out["reward"] = [one(r) for r in reward]
    return out


def data_columns(value: Any, path: str) -> dict[str, str]:
    """`[train.data.columns]`: the task's fields (of either kind) mapped to the data files' column names."""
    known = sorted({f for fs in COLUMN_FIELDS.values() for f in fs})
    if not isinstance(value, Mapping):
        raise SpecError(path, "train.data.columns", "must be a table ({ question = \"query\" })")
    for key, column in value.items():
        if key not in known:
            raise SpecError(path, f"train.data.columns.{key}", f"unknown field (known: {', '.join(known)})")
        if not isinstance(column, str) or not column.strip() or len(column) > 256:
            raise SpecError(path, f"train.data.columns.{key}", "must be a column's name (a non-empty string)")
    return dict(value)


def task_rules(values: dict[str, Any], path: str) -> None:
    """The rules between `[train.task]` and the rest of `[train]`: a single-turn task has one turn (its
    `max_turns` default), no search tool and no passages, and reads its items from `[train.data]`;
    retrieval QA needs the passages of its data files."""
    kind = values["task"].kind if "task" in values else RETRIEVAL_QA
    data = values.get("data")
    if kind == SINGLE_TURN:
        if values.setdefault("max_turns", 1) != 1:
            raise SpecError(path, "train.max_turns", f"a single-turn task has one turn, got {values['max_turns']}")
        for key in RETRIEVAL_KEYS:
            if key in values:
                raise SpecError(path, f"train.{key}", "configures the search tool: retrieval_qa only")
        if data is None:
            raise SpecError(path, "train.data", "a single-turn task reads its items from [train.data] (train, eval)")
        if data.passages is not None:
            raise SpecError(path, "train.data.passages", "a single-turn task has no search tool: leave it out")
    elif data is not None and data.passages is None:
        raise SpecError(path, "train.data.passages", "is required for retrieval_qa (a JSONL or Parquet file)")
