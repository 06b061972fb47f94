"""Experiment specs: parse and validate a TOML file once, at the edge, and expand it into runs.

Every problem is reported as `SpecError(file, field, what is wrong)`; nothing past this module
sees an unchecked value.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..common import limits
from ..contracts import spec_fields
from ..contracts.evaluation_spec import parse_evaluations
from ..contracts.runspec import LIFECYCLE_DEFAULTS, ArmSpec
from ..errors import SpecError
from ..executor import EXECUTOR_NAMES
from . import arms as arm_fields
from .experiment import ExperimentSpec, Overheads, PowerSpec

SPEC_SCHEMA = spec_fields.default("schema")
METHODS = spec_fields.field("experiment.method").choices
MAX_SPEC_BYTES = limits.SPEC_MAX_BYTES
MAX_SEEDS = spec_fields.most("experiment.seeds")
MAX_ARMS = spec_fields.most("arms")  # explicit and swept together (spec/arms.py)
MAX_BUDGET_SECONDS = spec_fields.DAYS_30

NAME = limits.NAME
ARM_NAME = limits.ARM_NAME  # no '-': run keys split on it

# The keys each table may hold, their defaults and bounds: the spec's field table (spec_fields.py).
_EXPERIMENT_KEYS = spec_fields.keys("experiment")
_OVERHEAD_KEYS = spec_fields.keys("overheads")
_ARM_KEYS = spec_fields.keys("arms.<arm>")
_TOP_KEYS = spec_fields.keys("")
_POWER_KEYS = spec_fields.keys("power")
_D = spec_fields.default


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


def _num(p: str, where: str, v: Any, lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(p, where, f"must be a number, got {_kind(v)}")
    f = float(v)
    if not math.isfinite(f) or f > hi or f < lo or (open_lo and f == lo) or (open_hi and f == hi):
        bound = f"> {lo:g}" if open_lo else f">= {lo:g}"
        raise SpecError(p, where, f"must be {bound} and {'<' if open_hi else '<='} {hi:g}, got {v}")
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
        return _num(p, at, value, lo, hi, open_lo=f.open_lo, open_hi=f.open_hi)
    if f.type == "boolean":
        return _bool(p, at, value)
    return _str(p, at, value, pattern, f.choices)


def _arm(p: str, name: str, table: Any) -> ArmSpec:
    where = f"arms.{name}"
    if not ARM_NAME.match(name):
        raise SpecError(p, where, f"arm name {name!r} must be {limits.ARM_NAME_RULE}")
    t = _table(p, where, table)
    _unknown(p, where, t, _ARM_KEYS)
    t = {k: v for k, v in t.items() if k != "train"}  # its train overrides: _arm_trains
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


def _power(p: str, table: Any, seeds: Sequence[int]) -> PowerSpec:
    """The `[power]` table, each value checked by its field, and the rules between its keys."""
    t = _table(p, "power", table)
    _unknown(p, "power", t, _POWER_KEYS)
    plain = {k: _value(p, "power", t, f"power.{k}") for k in _POWER_KEYS - {"sigma", "waves"}}
    if plain["effect"] is not None and plain["effect_sd"] is not None:
        raise SpecError(p, "power.effect_sd", "give effect (in the metric's units) or effect_sd, not both")
    sigma = t.get("sigma", spec_fields.default("power.sigma"))
    if sigma != "ledger":
        f = spec_fields.field("power.sigma")
        if isinstance(sigma, str):
            raise SpecError(p, "power.sigma", f'must be "ledger" or a number > 0, got {sigma!r}')
        sigma = _num(p, "power.sigma", sigma, f.lo or 0.0, math.inf, open_lo=True)
    waves = t.get("waves", spec_fields.default("power.waves"))
    if not isinstance(waves, list):
        raise SpecError(p, "power.waves", f"must be an array of integers, got {_kind(waves)}")
    most = spec_fields.most("power.waves")
    if len(waves) > most:
        raise SpecError(p, "power.waves", f"has {len(waves)} waves; at most {most}")
    waves = [_int(p, f"power.waves[{i}]", w, 2, limits.INT_MAX) for i, w in enumerate(waves)]
    if plain["design"] == "sequential":
        if not waves:
            raise SpecError(p, "power.waves", 'design = "sequential" needs waves: the seeds at each look')
        if any(b <= a for a, b in itertools.pairwise(waves)):
            raise SpecError(p, "power.waves", f"{waves} must be strictly increasing")
        if waves[-1] > len(seeds):
            raise SpecError(p, "power.waves", f"the last wave needs {waves[-1]} seeds; experiment.seeds lists "
                            f"{len(seeds)}")
    elif waves:
        raise SpecError(p, "power.waves", 'waves are for design = "sequential"')
    return PowerSpec(**plain, sigma=sigma, waves=tuple(waves))


def _validate_train(p: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The validated `[train]` table, its model and data paths made absolute (from the spec's folder)
    and the defaults that decide what a run computes written out (train/config.py `resolve_defaults`)."""
    from ..train.config import TrainConfig, resolve_defaults, resolve_paths

    TrainConfig.from_table(table, p)
    return resolve_defaults(resolve_paths(table, Path(p).resolve().parent))


def _task_arms(p: str, arms: Sequence[ArmSpec], train: Mapping[str, Any]) -> None:
    """Exposure arms show held-out items through retrieval QA's templates: refused for another task."""
    task = train.get("task")
    kind = task.get("kind", "retrieval_qa") if isinstance(task, Mapping) else "retrieval_qa"
    for arm in arms:
        if kind != "retrieval_qa" and arm.exposure != "none":
            raise SpecError(p, f"arms.{arm.name}.exposure", f"exposure arms need train.task.kind = \"retrieval_qa\" "
                            f"(this spec's task is {kind!r})")


def _arm_trains(p: str, arms_t: Mapping[str, Any], train_raw: Mapping[str, Any], sweep: Mapping[str, Any] | None,
                arms: list[ArmSpec]) -> dict[str, dict[str, Any]]:
    """Each arm's overrides of [train] that change something (explicit arms' `[arms.NAME.train]`,
    then the sweep's arms, appended to `arms`), as differences from the spec's train."""
    def validate(table: Mapping[str, Any]) -> dict[str, Any]:
        return _validate_train(p, table)

    base = validate(train_raw)
    trains: dict[str, dict[str, Any]] = {}
    for name, t in arms_t.items():
        if isinstance(t, dict) and "train" in t:
            where = f"arms.{name}.train"
            trains[name] = arm_fields.arm_train(p, where, train_raw, arm_fields.override_table(p, where, t["train"]),
                                                validate)
    if sweep:
        arm_fields.check_sweep_values(p, sweep, train_raw, validate)
        for name, overrides in arm_fields.sweep_arms(p, sweep, set(arms_t)):
            trains[name] = arm_fields.arm_train(p, f"arms.{name}.train", train_raw, overrides, validate)
            arms.append(ArmSpec(name=name))
    for name, t in trains.items():
        problem = limits.json_problem(t)
        if problem:
            raise SpecError(p, f"arms.{name}.train", problem)
    return arm_fields.effective_overrides(base, trains)


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
    canary = {key: _value(p, "experiment", e, f"experiment.{key}") for key in ("canary", "canary_gpus",
                                                                           "canary_minutes")}

    o = _table(p, "overheads", data.get("overheads", {}))
    _unknown(p, "overheads", o, _OVERHEAD_KEYS)
    overheads = Overheads(**{k: _value(p, "overheads", o, f"overheads.{k}") for k in sorted(_OVERHEAD_KEYS)})

    arms_t = _table(p, "arms", data.get("arms", {}))
    sweep = arm_fields.sweep_fields(p, data["sweep"]) if "sweep" in data else None
    if not arms_t and not sweep:
        raise SpecError(p, "arms", "at least one [arms.<name>] table (or a [sweep]) is required")
    arm_fields.check_arm_count(p, len(arms_t), sweep)
    arms = [_arm(p, n, t) for n, t in arms_t.items()]

    train_raw = _table(p, "train", data.get("train", {}))
    train = _validate_train(p, train_raw)
    _task_arms(p, arms, train)
    problem = limits.json_problem(train)  # stored as JSON in the ledger: finite, bounded, plain
    if problem:
        raise SpecError(p, "train", problem)
    trains = _arm_trains(p, arms_t, train_raw, sweep, arms)
    declared = _value(p, "experiment", e, "experiment.baseline", ARM_NAME)
    names = [a.name for a in arms]
    if declared is not None and declared not in names:
        raise SpecError(p, "experiment.baseline", f"{declared!r} is not an arm of the spec (arms: {', '.join(names)})")
    evaluations = parse_evaluations(p, data["evaluations"]) if "evaluations" in data else ()
    power = _power(p, data["power"], seeds) if "power" in data else None
    from .defaults import apply

    return apply(ExperimentSpec(path=p, name=name, method=method, seeds=tuple(seeds), arms=tuple(arms), gpus=gpus,
                                loop_budget_seconds=budget, executor=executor, profile=profile, max_gpu_hours=max_gh,
                                retries=retries, queue=queue, description=description, overheads=overheads,
                                train=json.loads(json.dumps(train)), nodes=nodes, priority=priority, evaluations=evaluations,
                                baseline=declared, arm_train=json.loads(json.dumps(trains)), sweep=sweep, power=power,
                                **lifecycle, **canary))


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
