"""Experiment specs: parse and validate a TOML file once, at the edge, and expand it into runs.

Every problem is reported as `SpecError(file, field, what is wrong)`; nothing past this module
sees an unchecked value.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import limits, spec_fields
from .accounting import allocated_gpus
from .errors import SpecError
from .evaluation_spec import EvaluationRequest, parse_evaluations, spec_requests
from .executor import EXECUTOR_NAMES
from .runspec import LIFECYCLE_DEFAULTS, ArmSpec, RunSpec

SPEC_SCHEMA = spec_fields.default("schema")
METHODS = spec_fields.field("experiment.method").choices
MAX_SPEC_BYTES = limits.SPEC_MAX_BYTES
MAX_SEEDS = spec_fields.most("experiment.seeds")
MAX_ARMS = spec_fields.most("arms")
MAX_BUDGET_SECONDS = spec_fields.DAYS_30

NAME = limits.NAME
ARM_NAME = limits.ARM_NAME  # no '-': run keys split on it

# The keys each table may hold, their defaults and bounds: the spec's field table (spec_fields.py).
_EXPERIMENT_KEYS = spec_fields.keys("experiment")
_OVERHEAD_KEYS = spec_fields.keys("overheads")
_ARM_KEYS = spec_fields.keys("arms.<arm>")
_TOP_KEYS = spec_fields.keys("")
_D = spec_fields.default


@dataclass(frozen=True)
class Overheads:
    """Seconds outside the loop budget but inside the allocation (used by the cost estimate)."""

    setup_export_seconds: float = _D("overheads.setup_export_seconds")
    audit_seconds: float = _D("overheads.audit_seconds")
    evaluation_seconds: float = _D("overheads.evaluation_seconds")

    @property
    def total_seconds(self) -> float:
        return self.setup_export_seconds + self.audit_seconds + self.evaluation_seconds


@dataclass(frozen=True)
class ExperimentSpec:
    """A validated experiment spec."""

    path: str
    name: str
    method: str
    seeds: tuple[int, ...]
    arms: tuple[ArmSpec, ...]
    gpus: int = _D("experiment.gpus")  # per node
    loop_budget_seconds: float = _D("experiment.loop_budget_seconds")
    executor: str = _D("experiment.executor")
    profile: str = _D("experiment.profile")
    max_gpu_hours: float | None = _D("experiment.max_gpu_hours")
    retries: int = _D("experiment.retries")
    queue: str | None = _D("experiment.queue")
    description: str = _D("experiment.description")
    overheads: Overheads = field(default_factory=Overheads)
    train: Mapping[str, Any] = field(default_factory=dict)
    nodes: int = _D("experiment.nodes")
    continue_on_timeout: bool = _D("experiment.continue_on_timeout")
    max_continuations: int = _D("experiment.max_continuations")
    keep_checkpoints: bool = _D("experiment.keep_checkpoints")
    # What was taken from the model, not the file (spec_defaults.py): "train.model.max_model_len = ...
    # (why)". Not part of the spec's identity: the values themselves are in `train`.
    defaults: tuple[str, ...] = ()
    priority: str = _D("experiment.priority")  # high | normal | low: how its runs are scheduled (priorities.py)
    # [[evaluations]]: scored after training, once each run succeeds (evaluation_spec.py)
    evaluations: tuple[EvaluationRequest, ...] = ()

    @property
    def allocated_gpus(self) -> int:
        """GPUs of one run's allocation: nodes x gpus per node."""
        return allocated_gpus(self.nodes, self.gpus)

    def canonical(self) -> dict[str, Any]:
        """Everything that defines the experiment (not where the file lives)."""
        d = asdict(self)
        d.pop("path")
        d.pop("defaults")
        d.pop("priority")  # when the runs are taken, not what they are: a change is no new version
        if self.nodes == 1:  # absent at the default: specs hashed before `nodes` existed keep their hash
            d.pop("nodes")
        for key, default in LIFECYCLE_DEFAULTS.items():  # absent at the default, as `nodes`
            if d[key] == default:
                d.pop(key)
        d["arms"] = [asdict(a) for a in self.arms]
        if not self.evaluations:  # absent when none: specs hashed before [[evaluations]] keep their hash
            d.pop("evaluations")
        return json.loads(json.dumps(d, sort_keys=True))

    @property
    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.canonical(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def arm(self, name: str) -> ArmSpec:
        for a in self.arms:
            if a.name == name:
                return a
        raise SpecError(self.path, "arms", f"no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def run_spec(self, arm: ArmSpec, seed: int, version: int) -> RunSpec:
        return RunSpec(
            run_key=run_key(self.name, version, seed, arm.name), experiment=self.name, experiment_version=version,
            method=self.method, arm=arm, seed=seed, gpus=self.gpus, loop_budget_seconds=self.loop_budget_seconds,
            executor=self.executor, profile=self.profile, retries=self.retries, train=dict(self.train),
            nodes=self.nodes, continue_on_timeout=self.continue_on_timeout, max_continuations=self.max_continuations,
            keep_checkpoints=self.keep_checkpoints, evaluations=spec_requests(self.evaluations),
        )

    def expand(self, version: int, arms: Sequence[str] | None = None,
               seeds: Sequence[int] | None = None) -> list[RunSpec]:
        """The arm x seed runs, optionally only some arms and seeds (each must exist in the spec)."""
        chosen_arms = [self.arm(a) for a in arms] if arms else list(self.arms)
        if seeds:
            unknown = [s for s in seeds if s not in self.seeds]
            if unknown:
                raise SpecError(self.path, "experiment.seeds", f"seed(s) {unknown} are not in the spec {list(self.seeds)}")
        chosen_seeds = list(seeds) if seeds else list(self.seeds)
        return [self.run_spec(a, s, version) for s in chosen_seeds for a in chosen_arms]


def run_key(experiment: str, version: int, seed: int, arm: str) -> str:
    """Globally unique, RQ-job-id safe ([A-Za-z0-9_-]) key of a run."""
    return f"{experiment}-v{version}-{seed}-{arm}"


# -- parsing --------------------------------------------------------------------------------------


def _read(path: Path) -> dict[str, Any]:
    p = str(path)
    try:
        raw = limits.read_input_file(path, max_bytes=MAX_SPEC_BYTES, what="spec file")
    except limits.InputRefused as exc:
        raise SpecError(p, "", exc.problem) from None
    if not raw:
        raise SpecError(p, "", "is empty")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(p, "", f"is not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(p, "", f"invalid TOML: {exc}") from None
    except RecursionError:
        raise SpecError(p, "", f"invalid TOML: nested too deep (at most {limits.JSON_MAX_DEPTH})") from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise SpecError(p, "", f"invalid TOML: {str(exc).split(':')[0]}") from None


def _unknown(p: str, where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(table) - allowed)
    if extra:
        key = extra[0]
        raise SpecError(p, f"{where}.{key}" if where else key, f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _table(p: str, where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(p, where, f"must be a table, got {_kind(value)}")
    return value


def _kind(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "a table"}.get(type(v), type(v).__name__)


def _int(p: str, where: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(p, where, f"must be an integer, got {_kind(v)}")
    problem = limits.int_problem(v, lo, hi)
    if problem:
        raise SpecError(p, where, problem)
    return v


def _num(p: str, where: str, v: Any, lo: float, hi: float, *, open_lo: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(p, where, f"must be a number, got {_kind(v)}")
    f = float(v)
    if not math.isfinite(f) or f > hi or f < lo or (open_lo and f == lo):
        bound = f"> {lo:g}" if open_lo else f">= {lo:g}"
        raise SpecError(p, where, f"must be {bound} and <= {hi:g}, got {v}")
    return f


def _bool(p: str, where: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise SpecError(p, where, f"must be true or false, got {_kind(v)}")
    return v


def _str(p: str, where: str, v: Any, pattern: re.Pattern[str] | None = None, choices: Sequence[str] = ()) -> str:
    if not isinstance(v, str):
        raise SpecError(p, where, f"must be a string, got {_kind(v)}")
    if choices and v not in choices:
        raise SpecError(p, where, f"must be one of {', '.join(choices)}, got {v!r}")
    if pattern is not None and not pattern.match(v):
        raise SpecError(p, where, f"{v!r} is not a valid name ({limits.NAME_RULE})")
    problem = limits.text_problem(v)
    if problem:
        raise SpecError(p, where, problem)
    return v


def _value(p: str, where: str, table: Mapping[str, Any], key: str, pattern: re.Pattern[str] | None = None) -> Any:
    """The value of the spec field `key` in `table` (its default when left out), checked by the field's
    type, bounds and choices (spec_fields.py); `where` names the table in a message."""
    f = spec_fields.field(key)
    at = f"{where}.{f.name}"
    value = table.get(f.name, spec_fields.default(key))
    if value is None:
        return None
    lo = f.lo if f.lo is not None else -math.inf
    hi = f.hi if f.hi is not None else math.inf
    if f.type == "integer":
        return _int(p, at, value, int(max(lo, -limits.INT_MAX)), int(min(hi, limits.INT_MAX)))
    if f.type == "number":
        return _num(p, at, value, lo, hi, open_lo=f.open_lo)
    if f.type == "boolean":
        return _bool(p, at, value)
    return _str(p, at, value, pattern, f.choices)


def _arm(p: str, name: str, table: Any) -> ArmSpec:
    where = f"arms.{name}"
    if not ARM_NAME.match(name):
        raise SpecError(p, where, f"arm name {name!r} must be {limits.ARM_NAME_RULE}")
    t = _table(p, where, table)
    _unknown(p, where, t, _ARM_KEYS)
    exposure = _value(p, where, t, "arms.<arm>.exposure")
    items = _value(p, where, t, "arms.<arm>.exposed_items")
    templates = t.get("templates", _D("arms.<arm>.templates"))
    if not isinstance(templates, list) or not all(isinstance(x, str) and x for x in templates):
        raise SpecError(p, f"{where}.templates", "must be an array of non-empty strings")
    for i, x in enumerate(templates):
        problem = limits.text_problem(x, max_chars=limits.NAME_MAX, single_line=True)
        if problem:
            raise SpecError(p, f"{where}.templates[{i}]", problem)
    if len(set(templates)) != len(templates):
        raise SpecError(p, f"{where}.templates", "has duplicates")
    aux = _value(p, where, t, "arms.<arm>.auxiliary_answer_loss")
    if exposure == "none" and (items or templates or aux):
        raise SpecError(p, where, "exposure \"none\" takes no exposed_items, templates or auxiliary_answer_loss")
    if exposure != "none" and (items == 0 or not templates):
        raise SpecError(p, where, f"exposure {exposure!r} needs exposed_items > 0 and at least one template")
    return ArmSpec(name=name, exposure=exposure, exposed_items=items, templates=tuple(templates),
                   auxiliary_answer_loss=aux)


def _validate_train(p: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The validated `[train]` table, its model and data paths made absolute (from the spec's folder)
    and the defaults that decide what a run computes written out (train/config.py `resolve_defaults`)."""
    from .train.config import (  # imports without torch
        TrainConfig,
        resolve_defaults,
        resolve_paths,
    )

    TrainConfig.from_table(table, p)
    return resolve_defaults(resolve_paths(table, Path(p).resolve().parent))


def parse_spec(data: Mapping[str, Any], path: str) -> ExperimentSpec:
    """Validate already-parsed TOML data."""
    p = path
    _unknown(p, "", data, _TOP_KEYS)
    schema = data.get("schema", SPEC_SCHEMA)
    if type(schema) is not int or schema != SPEC_SCHEMA:
        raise SpecError(p, "schema", f"this release reads schema {SPEC_SCHEMA}, got {schema!r}")
    if "experiment" not in data:
        raise SpecError(p, "experiment", "missing table [experiment]")
    e = _table(p, "experiment", data["experiment"])
    _unknown(p, "experiment", e, _EXPERIMENT_KEYS)
    for required in ("name", "method", "seeds"):
        if required not in e:
            raise SpecError(p, f"experiment.{required}", "is required")
    name = _str(p, "experiment.name", e["name"], NAME)
    method = _str(p, "experiment.method", e["method"], choices=METHODS)
    seeds = e["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise SpecError(p, "experiment.seeds", "must be a non-empty array of integers")
    if len(seeds) > MAX_SEEDS:
        raise SpecError(p, "experiment.seeds", f"has {len(seeds)} seeds; at most {MAX_SEEDS}")
    seeds = [_int(p, f"experiment.seeds[{i}]", s, limits.SEED_MIN, limits.SEED_MAX) for i, s in enumerate(seeds)]
    dup = sorted({s for s in seeds if seeds.count(s) > 1})
    if dup:
        raise SpecError(p, "experiment.seeds", f"duplicate seed(s) {dup}")
    description = _value(p, "experiment", e, "experiment.description")
    gpus = _value(p, "experiment", e, "experiment.gpus")
    nodes = _value(p, "experiment", e, "experiment.nodes")
    budget = _value(p, "experiment", e, "experiment.loop_budget_seconds")
    executor = _str(p, "experiment.executor", e.get("executor", _D("experiment.executor")), choices=EXECUTOR_NAMES)
    profile = _value(p, "experiment", e, "experiment.profile", NAME)
    if nodes > 1 and executor != "slurm":
        raise SpecError(p, "experiment.nodes", f"{nodes} nodes need executor = \"slurm\" (the {executor} executor "
                        "runs on this one machine)")
    max_gh = _value(p, "experiment", e, "experiment.max_gpu_hours")
    retries = _value(p, "experiment", e, "experiment.retries")
    queue = _value(p, "experiment", e, "experiment.queue", NAME)
    lifecycle = {key: _value(p, "experiment", e, f"experiment.{key}") for key in LIFECYCLE_DEFAULTS}
    priority = _value(p, "experiment", e, "experiment.priority")

    o = _table(p, "overheads", data.get("overheads", {}))
    _unknown(p, "overheads", o, _OVERHEAD_KEYS)
    overheads = Overheads(**{k: _value(p, "overheads", o, f"overheads.{k}") for k in sorted(_OVERHEAD_KEYS)})

    arms_t = _table(p, "arms", data.get("arms", {}))
    if not arms_t:
        raise SpecError(p, "arms", "at least one [arms.<name>] table is required")
    if len(arms_t) > MAX_ARMS:
        raise SpecError(p, "arms", f"has {len(arms_t)} arms; at most {MAX_ARMS}")
    arms = tuple(_arm(p, n, t) for n, t in arms_t.items())

    train = _validate_train(p, _table(p, "train", data.get("train", {})))
    problem = limits.json_problem(train)  # stored as JSON in the ledger: finite, bounded, plain
    if problem:
        raise SpecError(p, "train", problem)
    evaluations = parse_evaluations(p, data["evaluations"]) if "evaluations" in data else ()
    from .spec_defaults import apply

    return apply(ExperimentSpec(path=p, name=name, method=method, seeds=tuple(seeds), arms=arms, gpus=gpus,
                                loop_budget_seconds=budget, executor=executor, profile=profile, max_gpu_hours=max_gh,
                                retries=retries, queue=queue, description=description, overheads=overheads,
                                train=json.loads(json.dumps(train)), nodes=nodes, priority=priority, evaluations=evaluations,
                                **lifecycle))


def load_spec(path: str | Path) -> ExperimentSpec:
    """Read and validate a spec file."""
    path = Path(path)
    return parse_spec(_read(path), str(path))


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Readable lines for every field that differs between two canonical specs."""
    lines: list[str] = []
    for key in sorted(set(old) | set(new)):
        where = f"{prefix}{key}"
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            lines += spec_diff(a, b, where + ".")
        elif a != b:
            lines.append(f"{where}: {json.dumps(a)} -> {json.dumps(b)}")
    return lines
