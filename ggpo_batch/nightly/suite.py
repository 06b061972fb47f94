"""The nightly suite spec (`nightly-cpu`, packaged as `ggpo_batch/data/suites/nightly-cpu.toml`):
methods, tier, seeds, budgets, corpus, schedule and the full-experiment decision that the record
carries. Parsed once, frozen. A suite named without a path is looked up like a profile
(`datafiles.search_path("suites")`: user, site, then packaged)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.datafiles import find
from ..errors import SpecError
from ..train.ggpo_config import GgpoConfig
from .corpus import CorpusSource

DEFAULT_SUITE = "nightly-cpu"  # a name, looked up on the suites search path
TIERS = ("l1_mechanism",)


@dataclass(frozen=True)
class Budgets:
    """Fixed step budgets of the tier; nothing is selected or retried."""

    teacher_steps: int = 8
    specialist_steps: int = 4
    student_steps: int = 2
    max_new_tokens: int = 16
    batch_size: int = 16
    window_bytes: int = 64
    prompt_bytes: int = 16
    learning_rate: float = 1e-2
    student_learning_rate: float = 1e-3
    eval_chunk_bytes: int = 128


@dataclass(frozen=True)
class GgpoTierConfig(GgpoConfig):
    """The suite's `[ggpo]`: the method's hyperparameters plus the tier's own draw limit."""

    max_group_draws_per_step: int = 4


@dataclass(frozen=True)
class Schedule:
    cron: str = "30 2 * * *"
    queue: str = "nightly"
    job_timeout_seconds: int = 900


@dataclass(frozen=True)
class Suite:
    name: str
    tier: str
    methods: tuple[str, ...]
    seeds: tuple[int, ...]
    time_goal_seconds: float
    width: int
    budgets: Budgets
    ggpo: GgpoTierConfig
    corpus: CorpusSource
    split: tuple[float, float, float]
    schedule: Schedule
    full_experiment_status: str
    full_experiment: Mapping[str, Any]
    path: Path


def _table(doc: Mapping[str, Any], name: str, path: Path) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise SpecError(path, name, "must be a table")
    return value


def _typed(cls: type, values: Mapping[str, Any], path: Path, table: str) -> Any:
    fields = cls.__dataclass_fields__
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SpecError(path, f"{table}.{unknown[0]}", f"unknown key (known: {', '.join(fields)})")
    for key, val in values.items():
        want = type(fields[key].default)
        if want is float and isinstance(val, int) and not isinstance(val, bool):
            val = float(val)
        if not isinstance(val, want) or isinstance(val, bool) != (want is bool):
            raise SpecError(path, f"{table}.{key}", f"must be {want.__name__}, got {val!r}")
        if want in (int, float) and val <= 0 and key != "kl_coef":
            raise SpecError(path, f"{table}.{key}", f"must be > 0, got {val!r}")
    try:
        return cls(**{k: (float(v) if type(fields[k].default) is float else v) for k, v in values.items()})
    except ValueError as exc:  # the config's own checks (GgpoConfig): "<field> <what is wrong>"
        key, _, problem = str(exc).partition(" ")
        raise SpecError(path, f"{table}.{key}", problem) from None


def load_suite(name_or_path: str | Path = DEFAULT_SUITE) -> Suite:
    """Parse and validate the suite TOML (by name on the search path, or by path); every error names
    the file and the field."""
    path = find("suites", name_or_path)
    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(path, "", "suite file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, "", f"not valid TOML: {exc}") from None
    if doc.get("schema") != 1:
        raise SpecError(path, "schema", f"must be 1, got {doc.get('schema')!r}")
    s = _table(doc, "suite", path)
    tier = s.get("tier", "l1_mechanism")
    if tier not in TIERS:
        raise SpecError(path, "suite.tier", f"must be one of {TIERS}, got {tier!r}")
    methods = tuple(s.get("methods", ["ggpo"]))
    seeds = s.get("seeds", [42, 43, 44])
    if not seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise SpecError(path, "suite.seeds", "must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise SpecError(path, "suite.seeds", "seeds must be distinct (no re-running a seed)")
    c = dict(_table(doc, "corpus", path))
    corpus_path = c.pop("path", None)
    split = tuple(float(x) for x in c.pop("split", [0.8, 0.1, 0.1]))
    if len(split) != 3 or abs(sum(split) - 1) > 1e-9 or min(split) <= 0:
        raise SpecError(path, "corpus.split", "must be three positive fractions summing to 1")
    try:
        corpus = CorpusSource(
            id=str(c.pop("id")),
            path=Path(corpus_path).expanduser() if corpus_path else None,
            sha256=(str(c.pop("sha256")).lower() if "sha256" in c else None),
            source_url=c.pop("source_url", None),
            max_bytes=int(c.pop("max_bytes", 4 << 20)),
            generated_bytes=int(c.pop("generated_bytes", 160_000)),
        )
    except KeyError as exc:
        raise SpecError(path, f"corpus.{exc.args[0]}", "is required") from None
    if c:
        raise SpecError(path, f"corpus.{sorted(c)[0]}", "unknown key")
    fe = dict(_table(doc, "full_experiment", path))
    status = fe.pop("status", "not_reproduced_high_cost")
    return Suite(
        name=str(s.get("name", "nightly-cpu")),
        tier=tier,
        methods=methods,
        seeds=tuple(seeds),
        time_goal_seconds=float(s.get("time_goal_seconds", 60)),
        width=int(_table(doc, "model", path).get("width", 24)),
        budgets=_typed(Budgets, _table(doc, "budgets", path), path, "budgets"),
        ggpo=_typed(GgpoTierConfig, _table(doc, "ggpo", path), path, "ggpo"),
        corpus=corpus,
        split=split,  # type: ignore[arg-type]
        schedule=_typed(Schedule, _table(doc, "schedule", path), path, "schedule"),
        full_experiment_status=str(status),
        full_experiment=fe,
        path=Path(path),
    )
