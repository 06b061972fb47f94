"""What a canary is: the short allocation that runs before a sweep, one per distinct shape (model,
rollout backend, ZeRO stage, tensor parallel size) among the runs' arms, and the plain-JSON spec its
job is given (train/run/canary.py). The executors submit it as they submit an evaluation after
training: one allocation of `gpus` GPUs on one node, named after the run it stands for (the first
run of its shape) and the attempt number, which the ledger books as an attempt of kind `canary`.

`[experiment] canary` (true | false) turns it on or off; left out, it is on for `executor = "slurm"`
with `rollout = "vllm"` and at least CANARY_MIN_RUNS runs in the enqueue (`wanted`). Imports nothing
heavy: the control plane and the job both read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from . import spec_fields
from .runspec import RunSpec

CANARY_SPEC_VERSION = 1
CANARY_RECORD_VERSION = 1
CANARY_RECORD_FILE = "canary.json"  # in the attempt's folder
CANARY_MIN_RUNS = 4  # runs in one enqueue from which a slurm + vllm experiment gets a canary by default
DEFAULT_CANARY_MINUTES = 20.0
# The RQ job id of a canary: `<run key of the run it stands for>-canary` (its only argument too).
CANARY_KEY_SUFFIX = "-canary"
# The states of a canary row (ledger/canaries.py): queued -> submitted -> running -> passed | failed,
# or lost (its job vanished, never booked an end); queued again for an infrastructure end (node
# failure, preemption) and by `ggpo-batch canary --rerun` after a fix.
CANARY_STATES = ("queued", "submitted", "running", "passed", "failed", "lost", "cancelled")
CANARY_FINAL = frozenset({"passed", "failed", "lost", "cancelled"})
# Plants for tests, at the function level (train/run/canary.py): each makes its own check fail.
CANARY_FAULT_ENV = "GGPO_CANARY_FAULT"
CANARY_FAULTS = ("push_skips_layer", "reduction_differs", "probe_over_ceiling")
CANARY_PRIORITY = "high"  # a canary waits on its queue's high-priority list: a sweep waits on it
CANARY_STEPS = 3  # training steps a canary takes with the spec's ZeRO settings


def canary_key(run_key: str) -> str:
    """The key (and RQ job id) of the canary standing for run `run_key`."""
    return f"{run_key}{CANARY_KEY_SUFFIX}"


def shape_of(train: Mapping[str, Any]) -> dict[str, Any]:
    """What a canary checks once for every run that shares it: the model, the rollout backend, the
    ZeRO stage and the tensor parallel size of a run's `train` table (defaults where absent)."""
    model = train.get("model")
    built_in = {k: train.get(k) for k in ("n_layer", "n_embd", "n_head", "n_positions") if k in train}
    built = "built-in " + json.dumps(built_in, sort_keys=True)
    return {"model": model.get("path") if isinstance(model, Mapping) else built,
            "rollout": train.get("rollout", spec_fields.default("train.rollout")),
            "zero_stage": train.get("zero_stage", spec_fields.default("train.zero_stage")),
            "tensor_parallel_size": train.get("tensor_parallel_size", spec_fields.default("train.tensor_parallel_size"))}


def shape_text(shape: Mapping[str, Any]) -> str:
    return (f"{shape['model']}, rollout {shape['rollout']}, ZeRO-{shape['zero_stage']}, "
            f"TP {shape['tensor_parallel_size']}")


def wanted(setting: bool | None, executor: str, runs: Sequence[RunSpec]) -> bool:
    """Does an enqueue of `runs` get a canary? `setting` is `[experiment] canary` (None: left out)."""
    if setting is not None:
        return setting
    vllm = any(shape_of(r.train)["rollout"] == "vllm" for r in runs)
    return executor == "slurm" and vllm and len(runs) >= CANARY_MIN_RUNS


@dataclass(frozen=True)
class CanarySpec:
    """What a canary's job is given: the run it stands for (its spec: model, rollout, ZeRO settings, the
    data its probe reads), the shape, its allocation (`gpus` on one node, `minutes`), and the runs of
    the shape it holds (`run_keys`)."""

    run_key: str  # the run it stands for: its job's name and folder, its attempt rows
    experiment: str
    experiment_version: int
    run_spec: Mapping[str, Any]
    shape: Mapping[str, Any]
    gpus: int
    minutes: float
    run_keys: tuple[str, ...] = ()
    version: int = CANARY_SPEC_VERSION
    profile: str = field(default="default")
    executor: str = field(default="slurm")

    @property
    def key(self) -> str:
        return canary_key(self.run_key)

    @property
    def run(self) -> RunSpec:
        return RunSpec.from_dict(dict(self.run_spec))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_keys"] = list(self.run_keys)
        return json.loads(json.dumps(d))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CanarySpec:
        if d.get("version") != CANARY_SPEC_VERSION:
            raise ValueError(f"canary spec version {d.get('version')!r}, this release reads {CANARY_SPEC_VERSION}")
        return cls(**{**dict(d), "run_keys": tuple(d.get("run_keys") or ())})

    @classmethod
    def from_json(cls, text: str) -> CanarySpec:
        return cls.from_dict(json.loads(text))


def canary_specs(runs: Sequence[RunSpec], *, gpus: int | None = None,
                 minutes: float | None = None) -> list[CanarySpec]:
    """One canary per distinct shape among `runs`, in the order the shapes first appear; each stands
    for the first run of its shape and holds every run of it."""
    by_shape: dict[str, list[RunSpec]] = {}
    shapes: dict[str, dict[str, Any]] = {}
    for r in runs:
        shape = shape_of(r.train)
        k = json.dumps(shape, sort_keys=True)
        by_shape.setdefault(k, []).append(r)
        shapes[k] = shape
    out = []
    for k, members in by_shape.items():
        first = members[0]
        out.append(CanarySpec(run_key=first.run_key, experiment=first.experiment,
                              experiment_version=first.experiment_version, run_spec=first.to_dict(),
                              shape=shapes[k], gpus=gpus or first.gpus, minutes=minutes or DEFAULT_CANARY_MINUTES,
                              run_keys=tuple(r.run_key for r in members), profile=first.profile,
                              executor=first.executor))
    return out
