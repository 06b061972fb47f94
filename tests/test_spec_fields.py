"""The spec's field table (ggpo_batch/contracts/spec_fields.py) against the code that parses a spec: every
dataclass of the parser has exactly the table's keys with the table's defaults, and the parser
accepts each bound and choice the table states and refuses what lies beyond, a value of the wrong
type and a missing required key, naming the field. Each check is shown failing on a planted defect.
(docs/reference/spec.md, generated from the table, is compared in tests/test_docs.py.)"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from ggpo_batch.contracts import spec_fields
from ggpo_batch.contracts.evaluation_spec import EvaluationRequest
from ggpo_batch.contracts.runspec import ArmSpec
from ggpo_batch.contracts.spec_fields import REQUIRED, Field
from ggpo_batch.errors import SpecError
from ggpo_batch.executor import EXECUTOR_NAMES
from ggpo_batch.spec import parse as spec
from ggpo_batch.spec.parse import ExperimentSpec, Overheads, PowerSpec, parse_spec
from ggpo_batch.train.config import DataConfig, ModelConfig, TrainConfig

# The parser's dataclass of each table of the spec, and the fields of it that are not spec keys.
CLASSES: dict[str, tuple[type, frozenset[str]]] = {
    "experiment": (ExperimentSpec, frozenset({"path", "arms", "overheads", "train", "defaults", "evaluations",
                                              "arm_train", "sweep", "power"})),
    "power": (PowerSpec, frozenset()),
    "overheads": (Overheads, frozenset()),
    "arms.<arm>": (ArmSpec, frozenset({"name", "train"})),  # its train overrides: ExperimentSpec.arm_train
    "train": (TrainConfig, frozenset()),
    "train.model": (ModelConfig, frozenset()),
    "train.data": (DataConfig, frozenset()),
    "evaluations[]": (EvaluationRequest, frozenset()),
}
def table_problems(classes: dict[str, tuple[type, frozenset[str]]], rows: tuple[Field, ...]) -> list[str]:
    """Where the parser's dataclasses and the table disagree: a field without a row, a row without a
    field (of the classes that hold every key), a default that is not the table's."""
    by_key = {f.key: f for f in rows}
    problems = []
    for section, (cls, not_keys) in classes.items():
        declared = {f.name: f for f in dataclasses.fields(cls) if f.name not in not_keys}
        rows_here = {f.name for f in rows if f.section == section}
        for name in sorted(set(declared) - rows_here):
            problems.append(f"{section}.{name}: a field of {cls.__name__} with no row in spec_fields.FIELDS")
        for name in sorted(rows_here - set(declared) - not_keys):
            problems.append(f"{section}.{name}: a row of spec_fields.FIELDS that {cls.__name__} does not declare")
        for name, f in declared.items():
            row = by_key.get(f"{section}.{name}")
            if row is None or row.default is REQUIRED:
                continue
            value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if isinstance(row.default, list):
                value = list(value)
            if value != row.default:
                problems.append(f"{section}.{name}: {cls.__name__} defaults to {value!r}, the table says "
                                f"{row.default!r}")
    return problems


def test_the_parsers_dataclasses_hold_the_tables_keys_and_defaults() -> None:
    assert table_problems(CLASSES, spec_fields.FIELDS) == []
    assert spec_fields.field("experiment.executor").choices == EXECUTOR_NAMES  # the executor registry's names
    assert spec_fields.keys("") == {"schema", "experiment", "overheads", "arms", "train", "evaluations", "sweep",
                                    "power"}


def test_a_key_added_to_a_parser_without_its_row_or_a_default_changed_is_found() -> None:
    @dataclasses.dataclass(frozen=True)
    class Grown(TrainConfig):
        pack_rows: bool = False  # a new [train] key, no row

    changed = tuple(dataclasses.replace(f, default=5) if f.key == "train.group_size" else f
                    for f in spec_fields.FIELDS)
    assert table_problems({"train": (Grown, frozenset())}, spec_fields.FIELDS) == [
        "train.pack_rows: a field of Grown with no row in spec_fields.FIELDS"]
    assert table_problems({"train": (TrainConfig, frozenset())}, changed) == [
        "train.group_size: TrainConfig defaults to 4, the table says 5"]
    with pytest.raises(SpecError, match="train.pack_rows: unknown key"):  # and the parser refuses it
        TrainConfig.from_table({"pack_rows": True}, "j.toml")


# -- the parser against each row's bounds, choices, type and requiredness --------------------------

BASE: dict[str, Any] = {
    "schema": 1,
    "experiment": {"name": "t", "method": "ggpo", "seeds": [1], "executor": "debug", "loop_budget_seconds": 5},
    "arms": {"clean": {}, "paired": {"exposure": "paired", "exposed_items": 3, "templates": ["a"]}},
    "evaluations": [{"name": "e2", "data": "e2.jsonl"}],
    "train": {},
}
# Where a key's value goes in BASE (arms in "paired", evaluations in the first), what that table holds
# first, and the field's name in a message.
PLACES: dict[str, tuple[tuple[str | int, ...], dict[str, Any], str]] = {
    "": ((), {}, ""), "experiment": (("experiment",), {}, "experiment."), "overheads": (("overheads",), {}, "overheads."),
    "arms.<arm>": (("arms", "paired"), {}, "arms.paired."), "evaluations[]": (("evaluations", 0), {}, "evaluations[0]."),
    "train": (("train",), {}, "train."), "power": (("power",), {}, "power."),
    "train.model": (("train", "model"), {"path": "m", "max_model_len": 512}, "train.model."),
    "train.data": (("train", "data"), {"train": "t", "eval": "e", "passages": "p"}, "train.data."),
    "train.task": (("train", "task"), {}, "train.task."),
}


def _context(f: Field, value: Any) -> dict[str, Any]:
    """Sibling keys a value needs to be valid alone (the rules between keys are not the bound's)."""
    if f.key == "experiment.nodes":
        return {"executor": "slurm"}
    if f.key in ("train.tensor_parallel_size", "train.vllm_enforce_eager"):
        return {"rollout": "vllm"}
    if f.key == "train.rollout_is_cap":
        return {"old_logprobs": "rollout"}
    if f.key == "train.n_embd":
        return {"n_head": 1}
    if f.key == "train.eval_samples":
        return {"eval_temperature": 1.0}
    if (f.key, value) == ("power.design", "sequential"):
        return {"waves": [2]}
    if f.key == "power.waves":
        return {"design": "sequential"}
    if (f.key, value) in (("arms.<arm>.exposure", "none"), ("arms.<arm>.exposed_items", 0)):
        return {"exposure": "none", "exposed_items": 0, "templates": []}
    return {}


def _spec(f: Field, value: Any, *, drop: bool = False) -> dict[str, Any]:
    """BASE with `value` at `f`'s place (or, with `drop`, without the key)."""
    data = copy.deepcopy(BASE)
    path, first, _ = PLACES[f.section]
    table: Any = data
    for part in path:
        table = table.setdefault(part, copy.deepcopy(first)) if isinstance(part, str) else table[part]
    table.update(_context(f, value))
    if f.section == "power":  # a wave of seeds needs the seeds
        data["experiment"]["seeds"] = list(range(1, 3 if f.key != "power.waves" else 40))
    if drop:
        table.pop(f.name, None)
    else:
        table[f.name] = value
    if (f.key, value) == ("train.task.kind", "single_turn"):  # its rules: data without passages, no exposure arm
        data["arms"] = {"clean": {}}
        data["train"]["data"] = {"train": "t", "eval": "e"}
    return data


def _refusal(f: Field, data: dict[str, Any], tmp: Path) -> str | None:
    """The field a SpecError names ("unknown" when it refuses the key as unknown), or None: accepted."""
    try:
        parse_spec(data, str(tmp / "spec.toml"))
    except SpecError as exc:
        return "unknown" if exc.problem.startswith("unknown") else exc.field
    return None


def _names(f: Field, field_name: str | None) -> bool:
    prefix = PLACES[f.section][2]
    expected = f"{prefix}{f.name}"
    return field_name is not None and (field_name == expected or field_name.startswith(expected + "["))


def _inside_and_beyond(f: Field) -> list[tuple[Any, bool]]:
    """(value, accepted?) at and just past each stated bound, and for each choice."""
    if f.choices:
        bogus = "bogus" if isinstance(f.choices[0], str) else max(f.choices) + 1
        return [(c, True) for c in f.choices] + [(bogus, False)]
    out: list[tuple[Any, bool]] = []
    integer = f.type.endswith(("integer", "integers"))
    for bound, is_open, sign in ((f.lo, f.open_lo, 1), (f.hi, f.open_hi, -1)):
        if bound is None:
            continue
        if integer:
            b = int(bound)
            out += [(b, True), (b - sign, False)]
        else:
            step = max(abs(bound), 1.0) * 1e-9
            out += [(bound, not is_open), (bound + sign * step if is_open else bound - sign * step, is_open)]
    if f.type.startswith("array of integers"):
        out = [([v], ok) for v, ok in out]
    return out


SKIP_AT_BOUND = {"train.n_positions"}  # its floor is a rule between keys (the prompt must fit), above 1
# A row whose name stands for any key of its table ("train.lr" in [sweep]): tests/test_arms.py checks it.
PATTERN_ROWS = {"sweep.<field>"}


def bound_problems(f: Field, tmp: Path) -> list[str]:
    """Where the parser disagrees with the row: a stated bound or choice refused, a value beyond it
    accepted, a wrong type or a missing required key not refused naming the field."""
    problems: list[str] = []
    if f.key in PATTERN_ROWS:
        return problems
    for value, accepted in _inside_and_beyond(f):
        if accepted and f.key in SKIP_AT_BOUND:
            continue
        named = _refusal(f, _spec(f, value), tmp)
        if accepted and named is not None:
            problems.append(f"{f.key} = {value!r}: the table allows it, the parser refuses it ({named})")
        if not accepted and not _names(f, named):
            problems.append(f"{f.key} = {value!r}: beyond the table's limit, the parser "
                            f"{'accepts it' if named is None else 'names ' + named}")
    wrong = "x" if "table" in f.type else {"a": 1}
    if not _names(f, _refusal(f, _spec(f, wrong), tmp)):
        problems.append(f"{f.key}: a value of the wrong type is not refused naming it: the parser does not read it "
                        f"(or knows no such key)")
    if f.default is REQUIRED and not _names(f, _refusal(f, _spec(f, None, drop=True), tmp)):
        problems.append(f"{f.key}: required by the table, the parser takes the spec without it")
    if f.max_items is not None:
        at = _entries(f, f.max_items)
        if _refusal(f, _spec(f, at), tmp) is not None or not _names(f, _refusal(f, _spec(f, _entries(f, f.max_items + 1)),
                                                                                     tmp)):
            problems.append(f"{f.key}: the parser does not hold at most {f.max_items} entries")
    return problems


def _entries(f: Field, n: int) -> Any:
    if f.key == "experiment.seeds":
        return list(range(n))
    if f.key == "arms":
        return {f"a{i}": {} for i in range(n)}
    if f.key == "train.task.reward":
        return [f"r{i}.py:score" for i in range(n)]
    if f.key == "sweep":  # n fields, one value each
        return {f"train.{k}": [v] for k, v in list({"lr": 0.1, "kl_coef": 0.1, "grad_clip": 0.5, "aux_coef": 0.5,
                                                     "temperature": 0.5, "max_steps": 3, "checkpoint_every": 3,
                                                     "clip_epsilon": 0.1, "advantage_eps": 0.1}.items())[:n]}
    if f.key == "power.waves":
        return list(range(2, n + 2))
    return [{"name": f"e{i}", "data": "e.jsonl"} for i in range(n)]


def test_the_parser_holds_every_bound_choice_type_and_requirement_of_the_table(tmp_path: Path) -> None:
    problems = [p for f in spec_fields.FIELDS for p in bound_problems(f, tmp_path)]
    assert problems == []


@pytest.mark.parametrize("key, change, problem", [
    ("train.group_size", {"lo": 3}, "train.group_size = 2: beyond the table's limit, the parser accepts it"),
    ("train.clip_epsilon", {"open_hi": False}, "train.clip_epsilon = 1: the table allows it, the parser refuses it"),
    ("experiment.retries", {"hi": 20}, "experiment.retries = 20: the table allows it"),
    ("arms.<arm>.exposure", {"choices": ("none", "paired", "random", "blocked")}, "'blocked': the table allows it"),
    ("experiment.description", {"default": REQUIRED}, "required by the table, the parser takes the spec without it"),
])
def test_a_row_that_misstates_the_parser_is_found(tmp_path: Path, key: str, change: dict[str, Any],
                                                  problem: str) -> None:
    planted = dataclasses.replace(spec_fields.field(key), **change)
    found = bound_problems(planted, tmp_path)
    assert any(problem in p for p in found), found


def test_a_row_the_parser_never_reads_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ghost = Field("experiment.colour", "string", "red", "A key no parser reads.")
    unread = "experiment.colour: a value of the wrong type is not refused naming it"
    assert any(p.startswith(unread) for p in bound_problems(ghost, tmp_path))  # a key the parser does not know
    monkeypatch.setattr(spec, "_EXPERIMENT_KEYS", spec._EXPERIMENT_KEYS | {"colour"})  # known, never read
    assert any(p.startswith(unread) for p in bound_problems(ghost, tmp_path))


def test_field_problem_and_texts() -> None:
    f = spec_fields.field("train.vllm_gpu_memory_utilization")
    assert (f.problem(1.0), f.problem(0.0)) == (None, "must be in (0, 1], got 0.0")
    assert f.problem(math.nan) is not None
    assert spec_fields.field("train.tensor_parallel_size").problem(3) == "must be 1, 2, 4 or 8 (GPUs of one node), got 3"
    assert spec_fields.field("experiment.seeds").limit_text().startswith("each in 0..2^63-1; at most 1,000 entries")
    assert spec_fields.field("experiment.max_gpu_hours").limit_text() == "in (0, 1e7]"
