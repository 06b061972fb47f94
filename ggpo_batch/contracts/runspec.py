"""The run spec: the versioned, plain-JSON description of one arm x seed run.

This is what goes on the queue and what the training job receives: data, never a pickled
object, so a worker of the next release can still read it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import GgpoError
from . import spec_fields
from .accounting import allocated_gpus

RUN_SPEC_VERSION = 1

EXPOSURES: tuple[str, ...] = spec_fields.field("arms.<arm>.exposure").choices


@dataclass(frozen=True)
class ArmSpec:
    """One experiment arm: how held-out evaluation items are exposed during training.

    exposure "none": no exposure (the `clean` arm). "paired": `exposed_items` held-out items, each
    shown through every template, the copies forming shared groups. "random": the same number of
    exposures drawn at random, unpaired. `auxiliary_answer_loss` adds a supervised loss on verified
    gold answers (the `*_answer` arms).
    """

    name: str
    exposure: str = spec_fields.default("arms.<arm>.exposure")
    exposed_items: int = spec_fields.default("arms.<arm>.exposed_items")
    templates: tuple[str, ...] = ()
    auxiliary_answer_loss: bool = spec_fields.default("arms.<arm>.auxiliary_answer_loss")

    @property
    def target_exposed(self) -> int:
        return self.exposed_items * len(self.templates) if self.exposure != "none" else 0


# What a run spec says about where and how often a run runs, not about its result.
_NOT_CONFIG = frozenset({"executor", "profile", "retries", "run_key", "experiment_version", "continue_on_timeout",
                         "max_continuations", "keep_checkpoints", "evaluations"})
# Continuations of a run past its time limit allowed by default (with continue_on_timeout).
DEFAULT_MAX_CONTINUATIONS: int = spec_fields.default("experiment.max_continuations")


# The defaults of RunSpec.lifecycle(): a run spec and an experiment spec leave a key out at its
# default, so run specs and spec hashes made before these keys existed stay the same.
LIFECYCLE_DEFAULTS = {key: spec_fields.default(f"experiment.{key}") for key in
                      ("continue_on_timeout", "max_continuations", "keep_checkpoints")}


def config_hash(run_spec: Mapping[str, Any]) -> str:
    """`RunSpec.config_hash` of a run spec's dict (`RunSpec.to_dict`), for a caller that has it
    already (enqueue stores the dict too: one `to_dict` per run, not two)."""
    kept = {k: v for k, v in run_spec.items() if k not in _NOT_CONFIG}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs, independent of where it runs."""

    run_key: str
    experiment: str
    experiment_version: int
    method: str
    arm: ArmSpec
    seed: int
    gpus: int
    loop_budget_seconds: float
    executor: str
    profile: str
    retries: int = 0
    train: Mapping[str, Any] = field(default_factory=dict)
    version: int = RUN_SPEC_VERSION
    nodes: int = 1  # `gpus` is per node
    # A run that reaches its allocation's time limit checkpoints; with continue_on_timeout it goes on
    # in a new allocation (a new attempt), at most max_continuations times; else it ends `timeout`.
    continue_on_timeout: bool = False
    max_continuations: int = DEFAULT_MAX_CONTINUATIONS
    keep_checkpoints: bool = False  # keep the run's checkpoint after its record is booked
    # The spec's [[evaluations]] ({"name", "data", "gpus"}, evaluation_spec.EvaluationRequest): queued
    # by settlement once the run succeeds, after its training (not part of its result: not hashed).
    evaluations: tuple[Mapping[str, Any], ...] = ()

    @property
    def allocated_gpus(self) -> int:
        """GPUs of the whole allocation (nodes x gpus per node): what quota and GPU-hours count."""
        return allocated_gpus(self.nodes, self.gpus)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (hand-written: dataclasses.asdict deep-copies and is slow at 10k runs)."""
        a = self.arm
        return {
            "run_key": self.run_key, "experiment": self.experiment, "experiment_version": self.experiment_version,
            "method": self.method, "seed": self.seed, "gpus": self.gpus,
            "loop_budget_seconds": self.loop_budget_seconds, "executor": self.executor, "profile": self.profile,
            "retries": self.retries, "train": json.loads(json.dumps(self.train)) if self.train else {},
            "version": self.version,
            **({"nodes": self.nodes} if self.nodes != 1 else {}),  # absent at 1: older run specs and hashes stay
            **{k: v for k, v in self.lifecycle().items() if v != LIFECYCLE_DEFAULTS[k]},  # absent at defaults
            **({"evaluations": [dict(e) for e in self.evaluations]} if self.evaluations else {}),  # absent if none
            "arm": {"name": a.name, "exposure": a.exposure, "exposed_items": a.exposed_items,
                    "templates": list(a.templates), "auxiliary_answer_loss": a.auxiliary_answer_loss},
        }

    def lifecycle(self) -> dict[str, Any]:
        """What happens to the run at a time limit and to its checkpoint (the spec's [experiment] keys)."""
        return {"continue_on_timeout": self.continue_on_timeout, "max_continuations": self.max_continuations,
                "keep_checkpoints": self.keep_checkpoints}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def config_hash(self) -> str:
        """sha256 of what determines the run's result (not where or how often it runs)."""
        return config_hash(self.to_dict())

    @classmethod
    def from_json(cls, text: str | bytes) -> RunSpec:
        d = json.loads(text)
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSpec:
        version = d.get("version")
        if version != RUN_SPEC_VERSION:
            raise GgpoError(f"run spec version {version!r} is not supported (this release reads {RUN_SPEC_VERSION})")
        d = dict(d)
        arm = dict(d.pop("arm"))
        arm["templates"] = tuple(arm.get("templates", ()))
        if "evaluations" in d:
            d["evaluations"] = tuple(dict(e) for e in d["evaluations"])
        return cls(arm=ArmSpec(**arm), **d)


def run_key(experiment: str, version: int, seed: int, arm: str) -> str:
    """Globally unique, RQ-job-id safe ([A-Za-z0-9_-]) key of a run."""
    return f"{experiment}-v{version}-{seed}-{arm}"


def run_lifecycle(run_spec: Mapping[str, Any] | None) -> tuple[bool, int]:
    """(continue_on_timeout, max_continuations) of a run, from its run spec (as the ledger stores it)."""
    spec: Mapping[str, Any] = run_spec or {}
    return bool(spec.get("continue_on_timeout", False)), int(spec.get("max_continuations", DEFAULT_MAX_CONTINUATIONS))


DEFAULT_BASELINE = "clean"


def baseline_arm(arms: Sequence[str], declared: str | None = None) -> str | None:
    """The arm the others are paired against: the declared one (`[experiment] baseline`), else
    `clean` where there is such an arm, else the first arm; None without arms. One home for the
    report, the dashboard, `plan` and `advise`."""
    if declared:
        return declared
    if DEFAULT_BASELINE in arms:
        return DEFAULT_BASELINE
    return arms[0] if arms else None


def spec_baseline(spec: Mapping[str, Any], arms_run: Sequence[str]) -> str:
    """The baseline of a canonical spec as the ledger stores it: its `[experiment] baseline`, else
    `baseline_arm` over the spec's arms in their order (an imported record, which has none: the
    arms it ran)."""
    arms = [a.get("name") for a in spec.get("arms") or () if isinstance(a, Mapping) and a.get("name")]
    return baseline_arm(arms or list(arms_run), spec.get("baseline")) or DEFAULT_BASELINE
