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

from . import limits
from .accounting import allocated_gpus
from .errors import SpecError
from .evaluation_spec import EvaluationRequest, parse_evaluations, spec_requests
from .executor import EXECUTOR_NAMES
from .priorities import DEFAULT_PRIORITY, PRIORITIES
from .runspec import (
    DEFAULT_MAX_CONTINUATIONS,
    EXPOSURES,
    LIFECYCLE_DEFAULTS,
    ArmSpec,
    RunSpec,
)

SPEC_SCHEMA = 1
METHODS = ("ggpo",)
MAX_SPEC_BYTES = limits.SPEC_MAX_BYTES
MAX_SEEDS = 1000
MAX_ARMS = 64
MAX_GPUS = 64  # per node
MAX_NODES = 64
MAX_BUDGET_SECONDS = 30 * 24 * 3600.0
MAX_RETRIES = 10
MAX_CONTINUATIONS = 100

NAME = limits.NAME
ARM_NAME = limits.ARM_NAME  # no '-': run keys split on it

_EXPERIMENT_KEYS = {"name", "method", "description", "seeds", "gpus", "nodes", "loop_budget_seconds", "executor", "profile",
                    "max_gpu_hours", "retries", "queue", "continue_on_timeout", "max_continuations",
                    "keep_checkpoints", "priority"}

_OVERHEAD_KEYS = {"setup_export_seconds", "audit_seconds", "evaluation_seconds"}
_ARM_KEYS = {"exposure", "exposed_items", "templates", "auxiliary_answer_loss"}
_TOP_KEYS = {"schema", "experiment", "overheads", "train", "arms", "evaluations"}


@dataclass(frozen=True)
class Overheads:
    """Seconds outside the loop budget but inside the allocation (used by the cost estimate)."""

    setup_export_seconds: float = 600.0
    audit_seconds: float = 30.0
    evaluation_seconds: float = 60.0

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
    gpus: int = 4  # per node
    loop_budget_seconds: float = 2700.0
    executor: str = "slurm"
    profile: str = "default"
    max_gpu_hours: float | None = None
    retries: int = 0
    queue: str | None = None
    description: str = ""
    overheads: Overheads = field(default_factory=Overheads)
    train: Mapping[str, Any] = field(default_factory=dict)
    nodes: int = 1
    continue_on_timeout: bool = False
    max_continuations: int = DEFAULT_MAX_CONTINUATIONS
    keep_checkpoints: bool = False
    # What was taken from the model, not the file (spec_defaults.py): "train.model.max_model_len = ...
    # (why)". Not part of the spec's identity: the values themselves are in `train`.
    defaults: tuple[str, ...] = ()
    priority: str = DEFAULT_PRIORITY  # high | normal | low: how its runs are scheduled (priorities.py)
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


def _arm(p: str, name: str, table: Any) -> ArmSpec:
    where = f"arms.{name}"
    if not ARM_NAME.match(name):
        raise SpecError(p, where, f"arm name {name!r} must be {limits.ARM_NAME_RULE}")
    t = _table(p, where, table)
    _unknown(p, where, t, _ARM_KEYS)
    exposure = _str(p, f"{where}.exposure", t.get("exposure", "none"), choices=EXPOSURES)
    items = _int(p, f"{where}.exposed_items", t.get("exposed_items", 0), 0, 10_000_000)
    templates = t.get("templates", [])
    if not isinstance(templates, list) or not all(isinstance(x, str) and x for x in templates):
        raise SpecError(p, f"{where}.templates", "must be an array of non-empty strings")
    for i, x in enumerate(templates):
        problem = limits.text_problem(x, max_chars=limits.NAME_MAX, single_line=True)
        if problem:
            raise SpecError(p, f"{where}.templates[{i}]", problem)
    if len(set(templates)) != len(templates):
        raise SpecError(p, f"{where}.templates", "has duplicates")
    aux = t.get("auxiliary_answer_loss", False)
    if not isinstance(aux, bool):
        raise SpecError(p, f"{where}.auxiliary_answer_loss", f"must be a boolean, got {_kind(aux)}")
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
    description = e.get("description", "")
    if not isinstance(description, str):
        raise SpecError(p, "experiment.description", f"must be a string, got {_kind(description)}")
    problem = limits.text_problem(description)
    if problem:
        raise SpecError(p, "experiment.description", problem)
    gpus = _int(p, "experiment.gpus", e.get("gpus", 4), 1, MAX_GPUS)
    nodes = _int(p, "experiment.nodes", e.get("nodes", 1), 1, MAX_NODES)
    budget = _num(p, "experiment.loop_budget_seconds", e.get("loop_budget_seconds", 2700), 0, MAX_BUDGET_SECONDS,
                  open_lo=True)
    executor = _str(p, "experiment.executor", e.get("executor", "slurm"), choices=EXECUTOR_NAMES)
    profile = _str(p, "experiment.profile", e.get("profile", "default"), NAME)
    if nodes > 1 and executor != "slurm":
        raise SpecError(p, "experiment.nodes", f"{nodes} nodes need executor = \"slurm\" (the {executor} executor "
                        "runs on this one machine)")
    max_gh = e.get("max_gpu_hours")
    if max_gh is not None:
        max_gh = _num(p, "experiment.max_gpu_hours", max_gh, 0, limits.GPU_HOURS_MAX, open_lo=True)
    retries = _int(p, "experiment.retries", e.get("retries", 0), 0, MAX_RETRIES)
    queue = e.get("queue")
    if queue is not None:
        queue = _str(p, "experiment.queue", queue, NAME)
    lifecycle = {key: _bool(p, f"experiment.{key}", e.get(key, False)) for key in ("continue_on_timeout",
                                                                                  "keep_checkpoints")}
    lifecycle["max_continuations"] = _int(p, "experiment.max_continuations",
                                          e.get("max_continuations", DEFAULT_MAX_CONTINUATIONS), 0, MAX_CONTINUATIONS)
    priority = _str(p, "experiment.priority", e.get("priority", DEFAULT_PRIORITY), choices=PRIORITIES)

    o = _table(p, "overheads", data.get("overheads", {}))
    _unknown(p, "overheads", o, _OVERHEAD_KEYS)
    defaults = Overheads()
    overheads = Overheads(**{k: _num(p, f"overheads.{k}", o.get(k, getattr(defaults, k)), 0, MAX_BUDGET_SECONDS)
                             for k in sorted(_OVERHEAD_KEYS)})

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
