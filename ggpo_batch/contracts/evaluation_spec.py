"""What an evaluation after training is: the request (a spec's `[[evaluations]]` entry, or `ggpo-batch
evaluate`'s arguments) and the plain-JSON spec its job is given, which the executors submit as they
submit a run spec (one allocation, found again by its run key and attempt number).

An evaluation scores one succeeded run's exported policy on a data file of items (the format of
`[train.data]`'s eval file) and stores the outcome as the run's outcome set `name`. Its key
`<run key>-eval_<name>` is its RQ job id. Imports nothing heavy: the control plane and the job
both read it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common import limits
from ..errors import GgpoError, SpecError
from . import spec_fields
from .runspec import RunSpec

EVALUATION_SPEC_VERSION = 1
# The version of the evaluation record an evaluation's job writes (its table: train/eval_job.py).
EVALUATION_RECORD_VERSION = 1
DEFAULT_EVALUATION_GPUS = spec_fields.default("evaluations[].gpus")
MAX_EVALUATION_GPUS = spec_fields.most("evaluations[].gpus")
# The outcome set a run's training allocation evaluated itself on (runs.outcome): `report`'s default,
# a name no evaluation after training may take.
TRAINING_OUTCOME_SET = "training"
_REQUEST_KEYS = spec_fields.keys("evaluations[]")
MAX_EVALUATIONS = spec_fields.most("evaluations")  # [[evaluations]] entries in one spec


def evaluation_key(run_key: str, name: str) -> str:
    """The key (and RQ job id) of the evaluation `name` of run `run_key` (limits.EVALUATION_KEY_INFIX)."""
    return f"{run_key}{limits.EVALUATION_KEY_INFIX}{name}"


def name_problem(name: Any) -> str | None:
    """Why `name` cannot name an outcome set (None: it can)."""
    problem = limits.outcome_set_problem(name)
    if problem is None and name == TRAINING_OUTCOME_SET:
        return f"{name!r} is the training allocation's own outcome set; choose another name"
    return problem


def file_sha256(path: str | Path) -> str:
    """sha256 of a data file's bytes: the evaluation checks the file it scores is the one validated."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class EvaluationRequest:
    """An evaluation asked for: outcome set `name`, the items of `data` (absolute path), `gpus` GPUs."""

    name: str
    data: str
    gpus: int = DEFAULT_EVALUATION_GPUS

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "data": self.data, "gpus": self.gpus}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvaluationRequest:
        return cls(name=str(d["name"]), data=str(d["data"]), gpus=int(d.get("gpus", DEFAULT_EVALUATION_GPUS)))


def parse_evaluations(path: str, value: Any) -> tuple[EvaluationRequest, ...]:
    """A spec's `[[evaluations]]` array of tables, checked (names unique, data paths made absolute from
    the spec's folder); the data files themselves are preflight's to read."""
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise SpecError(path, "evaluations", "must be an array of tables ([[evaluations]])")
    if len(value) > MAX_EVALUATIONS:
        raise SpecError(path, "evaluations", f"has {len(value)} entries; at most {MAX_EVALUATIONS}")
    out: list[EvaluationRequest] = []
    for i, t in enumerate(value):
        where = f"evaluations[{i}]"
        extra = sorted(set(t) - _REQUEST_KEYS)
        if extra:
            raise SpecError(path, f"{where}.{extra[0]}", f"unknown field (allowed: {', '.join(sorted(_REQUEST_KEYS))})")
        for key in ("name", "data"):
            if key not in t:
                raise SpecError(path, f"{where}.{key}", "is required")
        problem = name_problem(t["name"])
        if problem:
            raise SpecError(path, f"{where}.name", problem)
        data = t["data"]
        if not isinstance(data, str) or not data.strip() or limits.text_problem(data, single_line=True):
            raise SpecError(path, f"{where}.data", "must be the path of a JSONL file of items (one line)")
        gpus = t.get("gpus", DEFAULT_EVALUATION_GPUS)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_EVALUATION_GPUS:
            raise SpecError(path, f"{where}.gpus", f"must be an integer in 1..{MAX_EVALUATION_GPUS}, got {gpus!r}")
        if any(r.name == t["name"] for r in out):
            raise SpecError(path, f"{where}.name", f"{t['name']!r} names two evaluations")
        absolute = (Path(path).resolve().parent / Path(data).expanduser()).resolve()
        out.append(EvaluationRequest(t["name"], str(absolute), gpus))
    return tuple(out)


def evaluation_ranks(gpus: int, *, gpus_per_node: int, tasks_per_node: int) -> int:
    """Ranks of an evaluation on `gpus` GPUs of a node whose profile runs `tasks_per_node` ranks on
    `gpus_per_node`: the profile's ranks per GPU (one per GPU on a real cluster), at least one."""
    if gpus_per_node <= 0:
        return max(1, tasks_per_node)
    return max(1, math.floor(tasks_per_node * gpus / gpus_per_node))


@dataclass(frozen=True)
class EvaluationSpec:
    """Everything one evaluation's job needs, plain JSON (what its row keeps and its job receives)."""

    key: str
    name: str
    run_key: str
    data_path: str
    data_sha256: str
    items: int
    gpus: int
    policy_dir: str
    details_path: str  # the training job's details: its trained item ids (exposure in this set)
    run_spec: Mapping[str, Any] = field(default_factory=dict)
    version: int = EVALUATION_SPEC_VERSION

    # -- what the executors read of a spec (runspec.RunSpec's names) ---------------------------
    @property
    def run(self) -> RunSpec:
        return RunSpec.from_dict(self.run_spec)

    @property
    def executor(self) -> str:
        return str(self.run_spec["executor"])

    @property
    def profile(self) -> str:
        return str(self.run_spec.get("profile", "default"))

    @property
    def method(self) -> str:
        return str(self.run_spec["method"])

    nodes = 1  # one node: an evaluation is data parallel over its ranks, or one vLLM engine
    retries = 0  # never requeued: retried by hand only

    @property
    def allocated_gpus(self) -> int:
        return self.gpus

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "key": self.key, "name": self.name, "run_key": self.run_key,
                "data_path": self.data_path, "data_sha256": self.data_sha256, "items": self.items, "gpus": self.gpus,
                "policy_dir": self.policy_dir, "details_path": self.details_path,
                "run_spec": json.loads(json.dumps(self.run_spec))}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvaluationSpec:
        if d.get("version") != EVALUATION_SPEC_VERSION:
            raise GgpoError(f"evaluation spec version {d.get('version')!r} is not supported (this release reads "
                            f"{EVALUATION_SPEC_VERSION})")
        return cls(**{k: d[k] for k in ("key", "name", "run_key", "data_path", "data_sha256", "items", "gpus",
                                        "policy_dir", "details_path", "run_spec", "version")})

    @classmethod
    def from_json(cls, text: str | bytes) -> EvaluationSpec:
        return cls.from_dict(json.loads(text))


def requests_of(run_spec: Mapping[str, Any]) -> list[EvaluationRequest]:
    """The `[[evaluations]]` a run spec carries (RunSpec.evaluations, as stored in the ledger)."""
    return [EvaluationRequest.from_dict(d) for d in run_spec.get("evaluations", ()) or ()]


def spec_requests(spec_evaluations: Sequence[EvaluationRequest]) -> tuple[dict[str, Any], ...]:
    """`[[evaluations]]` as a run spec carries them."""
    return tuple(r.to_dict() for r in spec_evaluations)
