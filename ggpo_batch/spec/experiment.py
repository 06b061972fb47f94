"""A validated experiment spec: what `spec.parse_spec` returns and every check reads.

Apart from the parser, so that the defaults, the sizing and the preflight can name the type without
importing the parser that calls them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..contracts import spec_fields
from ..contracts.accounting import allocated_gpus
from ..contracts.arm_train import overlay
from ..contracts.evaluation_spec import EvaluationRequest, spec_requests
from ..contracts.runspec import LIFECYCLE_DEFAULTS, ArmSpec, RunSpec, baseline_arm, run_key
from ..errors import SpecError

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
class PowerSpec:
    """The `[power]` table: what the seeds must detect and how (reporting/power.py, control/planning.py)."""

    metric: str = _D("power.metric")
    direction: str = _D("power.direction")
    effect: float | None = _D("power.effect")
    effect_sd: float | None = _D("power.effect_sd")
    power: float = _D("power.power")
    alpha: float = _D("power.alpha")
    multiplicity: str = _D("power.multiplicity")
    sigma: float | str = _D("power.sigma")  # "ledger" or the sd of the paired differences
    design: str = _D("power.design")
    waves: tuple[int, ...] = tuple(_D("power.waves"))
    spending: str = _D("power.spending")
    futility: float = _D("power.futility")
    max_seeds: int = _D("power.max_seeds")


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
    # [experiment] baseline as declared (None: the default, runspec.baseline_arm); in the hash only where
    # it names another arm than the default would, so specs written before the key keep their hash
    baseline: str | None = _D("experiment.baseline")
    # Arm -> its overrides of `train` (`[arms.NAME.train]`, or its point of the sweep), as the difference
    # of its train from the spec's (contracts/arm_train.py): only the arms that change something.
    arm_train: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # [sweep] as written ("train.lr" -> values); its arms are in `arms`, after the explicit ones
    sweep: Mapping[str, Sequence[Any]] | None = None
    # [power], as declared (None: no table; absent from the hash, so specs without it keep theirs)
    power: PowerSpec | None = None
    # [experiment] canary / canary_gpus / canary_minutes (contracts/canary_spec.py); None: the automatic
    # choice and the defaults. Absent from the hash at None, so specs written before them keep theirs.
    canary: bool | None = _D("experiment.canary")
    canary_gpus: int | None = _D("experiment.canary_gpus")
    canary_minutes: float | None = _D("experiment.canary_minutes")

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
        for arm in d["arms"]:  # an arm's train overrides, only where it has some: older specs keep their hash
            if arm["name"] in self.arm_train:
                arm["train"] = self.arm_train[arm["name"]]
        d.pop("arm_train")
        if self.sweep is None:  # absent without [sweep]
            d.pop("sweep")
        if d["baseline"] is None or d["baseline"] == baseline_arm([a.name for a in self.arms]):
            d.pop("baseline")
        if not self.evaluations:  # absent when none: specs hashed before [[evaluations]] keep their hash
            d.pop("evaluations")
        if self.power is None:  # absent when none, as [[evaluations]]
            d.pop("power")
        for key in ("canary", "canary_gpus", "canary_minutes"):  # absent at None, as `power`
            if d[key] is None:
                d.pop(key)
        return json.loads(json.dumps(d, sort_keys=True))

    @property
    def spec_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.canonical(), sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    @property
    def baseline_arm(self) -> str:
        """The arm the others are paired against."""
        return baseline_arm([a.name for a in self.arms], self.baseline) or ""

    def arm(self, name: str) -> ArmSpec:
        for a in self.arms:
            if a.name == name:
                return a
        raise SpecError(self.path, "arms", f"no arm {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def train_of(self, arm: str) -> dict[str, Any]:
        """The arm's train: the spec's with the arm's overrides laid over it (what its run specs hold)."""
        return overlay(self.train, self.arm_train.get(arm, {}))

    @property
    def swept_arms(self) -> tuple[str, ...]:
        """The arms the sweep made (after the explicit ones)."""
        if not self.sweep:
            return ()
        n = 1
        for values in self.sweep.values():
            n *= len(values)
        return tuple(a.name for a in self.arms[len(self.arms) - n:])

    def run_spec(self, arm: ArmSpec, seed: int, version: int) -> RunSpec:
        return RunSpec(
            run_key=run_key(self.name, version, seed, arm.name), experiment=self.name, experiment_version=version,
            method=self.method, arm=arm, seed=seed, gpus=self.gpus, loop_budget_seconds=self.loop_budget_seconds,
            executor=self.executor, profile=self.profile, retries=self.retries, train=self.train_of(arm.name),
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
