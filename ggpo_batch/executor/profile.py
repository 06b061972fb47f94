"""A Slurm cluster profile: the allocation a run gets (partition, account, GPUs, time) on one cluster.

Profiles are TOML files `<name>.toml`, looked up on the search path of `datafiles` (the user's
`~/.config/ggpo-batch/profiles/`, the site's `/etc/ggpo-batch/profiles/`, then the packaged
`ggpo_batch/data/profiles/`), validated once here and mapped onto submitit's SlurmExecutor
parameters by `to_submitit_parameters()`.

A `[priority.<high|normal|low>]` table maps a run's priority (ggpo_batch/contracts/priorities.py) onto the
cluster's own: `nice` (sbatch `--nice`, >= 0: a plain user may only lower a job's priority) and/or
`qos` (replacing the profile's `qos` for runs of that priority). A priority without a table adds
nothing, so a profile without any submits every run alike:

    [priority.high]
    qos = "high"
    [priority.low]
    nice = 10000
"""

from __future__ import annotations

import logging
import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..common.datafiles import find
from ..contracts.priorities import PRIORITIES
from ..errors import SpecError
from .pacing import DEFAULT_BURST, DEFAULT_RATE_PER_S, SubmitPace

log = logging.getLogger(__name__)

PROFILE_SCHEMA = 1
# A value that stays one token inside an `#SBATCH --key=value` line and inside a shell word.
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=-]+$")
_EXTRA_LINE = re.compile(r"^--(?P<key>[a-z][a-z0-9-]*)(=(?P<value>[A-Za-z0-9_.,:/@%+=-]+))?$")
# Flags our own parameters set; an extra line may not override them behind the profile's back.
_OWNED_FLAGS = frozenset(
    {"job-name", "comment", "nodes", "gpus-per-node", "ntasks-per-node", "cpus-per-task", "mem", "time", "partition",
     "account", "qos", "constraint", "output", "error", "signal", "array", "wrap", "requeue", "no-requeue", "nice"}
)
NICE_MAX = 2147483645  # Slurm's largest nice value


@dataclass(frozen=True)
class SlurmProfile:
    """One cluster's allocation settings. `extra_sbatch` lines look like `--reservation=x` or `--exclusive`."""

    name: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    nodes: int = 1  # a run's allocation spans this many nodes, each with gpus_per_node GPUs
    gpus_per_node: int = 4
    tasks_per_node: int = 1  # training ranks per node: one per GPU on a real cluster
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    gpu_memory_gib: float | None = None  # memory of one GPU; preflight checks that the model fits in it
    time_limit_min: int = 60
    signal_delay_s: int = 90  # USR2 this long before the time limit: the job's checkpoint window
    setup: tuple[str, ...] = ()  # shell lines run in the batch script before srun (module load ...)
    extra_sbatch: tuple[str, ...] = ()
    use_srun: bool = True
    # sbatch pacing (pacing.py): a bucket of submit_burst tokens refilled at submit_rate_per_s, by
    # default Slurm's own per-user RPC limit; 0 turns pacing off (a cluster of your own)
    submit_burst: int = DEFAULT_BURST
    submit_rate_per_s: float = DEFAULT_RATE_PER_S
    # (priority, nice or None, qos or None) for each priority the profile maps (the module docstring)
    priorities: tuple[tuple[str, int | None, str | None], ...] = ()

    def priority_parameters(self, priority: str) -> dict[str, Any]:
        """The submitit parameters a run of `priority` adds to the profile's: `qos`, `nice` (which
        the executor passes to sbatch as `--nice`)."""
        for name, nice, qos in self.priorities:
            if name == priority:
                return {k: v for k, v in (("nice", nice), ("qos", qos)) if v is not None}
        return {}

    @property
    def pace(self) -> SubmitPace:
        return SubmitPace(self.submit_burst, self.submit_rate_per_s)

    def to_submitit_parameters(self) -> dict[str, Any]:
        """Keyword arguments for `submitit.SlurmExecutor.update_parameters` (native Slurm names)."""
        params: dict[str, Any] = {
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "ntasks_per_node": self.tasks_per_node,
            "time": self.time_limit_min,
            "signal_delay_s": self.signal_delay_s,
            "use_srun": self.use_srun,
        }
        for key in ("partition", "account", "qos", "constraint", "cpus_per_task"):
            value = getattr(self, key)
            if value is not None:
                params[key] = value
        if self.mem_gb is not None:
            params["mem"] = self.mem_gb  # submitit renders GB as "64GB" / "512MB"
        if self.setup:
            params["setup"] = list(self.setup)
        extra = self.additional_parameters()
        if extra:
            params["additional_parameters"] = extra
        return params

    def to_auto_parameters(self) -> dict[str, Any]:
        """The same settings for `submitit.AutoExecutor.update_parameters` (`slurm_` prefixed names)."""
        p = self.to_submitit_parameters()
        auto: dict[str, Any] = {
            "nodes": p.pop("nodes"),
            "gpus_per_node": p.pop("gpus_per_node"),
            "tasks_per_node": p.pop("ntasks_per_node"),
            "timeout_min": p.pop("time"),
        }
        if "cpus_per_task" in p:
            auto["cpus_per_task"] = p.pop("cpus_per_task")
        if "mem" in p:
            auto["mem_gb"] = p.pop("mem")
        auto.update({f"slurm_{k}": v for k, v in p.items()})
        return auto

    def additional_parameters(self) -> dict[str, Any]:
        """`extra_sbatch` lines as submitit's additional_parameters (flag without value -> True)."""
        out: dict[str, Any] = {}
        for line in self.extra_sbatch:
            m = _EXTRA_LINE.match(line)
            assert m is not None, line  # validated in load_profile
            out[m.group("key").replace("-", "_")] = m.group("value") if m.group("value") is not None else True
        return out


def _check(path: Path, field: str, value: Any, kind: type | tuple[type, ...], *, minimum: float | None = None) -> Any:
    if isinstance(value, bool) and kind is not bool:
        raise SpecError(path, field, f"expected {getattr(kind, '__name__', kind)}, got a boolean")
    if not isinstance(value, kind):
        raise SpecError(path, field, f"expected {getattr(kind, '__name__', kind)}, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(path, field, f"must be >= {minimum}, got {value!r}")
    return value


def profile_from_mapping(data: dict[str, Any], path: Path, name: str) -> SlurmProfile:
    """Validate a parsed profile table; errors name the file and the field."""
    data = dict(data)
    schema = data.pop("schema", PROFILE_SCHEMA)
    if schema != PROFILE_SCHEMA:
        raise SpecError(path, "schema", f"profile schema {schema!r} is not supported (this release reads {PROFILE_SCHEMA})")
    known = ({f.name for f in fields(SlurmProfile)} - {"name", "priorities"}) | {"priority"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(path, unknown[0], f"unknown profile key (known: {', '.join(sorted(known))})")
    kw: dict[str, Any] = {}
    for key in ("partition", "account", "qos", "constraint"):
        if key in data:
            value = _check(path, key, data[key], str)
            if not _SAFE_VALUE.match(value):
                raise SpecError(path, key, f"{value!r} has characters Slurm or a shell would misread")
            kw[key] = value
    for key, minimum in (("submit_burst", 1), ("nodes", 1), ("gpus_per_node", 0), ("tasks_per_node", 1), ("cpus_per_task", 1),
                         ("time_limit_min", 1), ("signal_delay_s", 0)):
        if key in data:
            kw[key] = _check(path, key, data[key], int, minimum=minimum)
    if "mem_gb" in data:
        kw["mem_gb"] = float(_check(path, "mem_gb", data["mem_gb"], (int, float), minimum=0))
    if "gpu_memory_gib" in data:
        kw["gpu_memory_gib"] = float(_check(path, "gpu_memory_gib", data["gpu_memory_gib"], (int, float), minimum=1))
    if "submit_rate_per_s" in data:
        rate = float(_check(path, "submit_rate_per_s", data["submit_rate_per_s"], (int, float), minimum=0))
        if not math.isfinite(rate):
            raise SpecError(path, "submit_rate_per_s", f"must be a finite number of sbatch calls per second, got {rate}")
        kw["submit_rate_per_s"] = rate
    if "use_srun" in data:
        kw["use_srun"] = _check(path, "use_srun", data["use_srun"], bool)
    for key in ("setup", "extra_sbatch"):
        if key in data:
            lines = _check(path, key, data[key], list)
            for i, line in enumerate(lines):
                _check(path, f"{key}[{i}]", line, str)
                if "\n" in line or "\r" in line:
                    raise SpecError(path, f"{key}[{i}]", "must be one line")
            kw[key] = tuple(lines)
    if "priority" in data:
        kw["priorities"] = _priorities(path, data["priority"])
    for i, line in enumerate(kw.get("extra_sbatch", ())):
        m = _EXTRA_LINE.match(line)
        if not m:
            raise SpecError(path, f"extra_sbatch[{i}]", f"{line!r} is not of the form --flag or --flag=value (no spaces or quotes)")
        if m.group("key") in _OWNED_FLAGS:
            raise SpecError(path, f"extra_sbatch[{i}]", f"--{m.group('key')} is set by the profile's own keys or by the executor")
    return SlurmProfile(name=name, **kw)


def _priorities(path: Path, table: Any) -> tuple[tuple[str, int | None, str | None], ...]:
    if not isinstance(table, dict):
        raise SpecError(path, "priority", f"must be a table of [priority.<{'|'.join(PRIORITIES)}>] tables")
    out = []
    for name, entry in table.items():
        where = f"priority.{name}"
        if name not in PRIORITIES:
            raise SpecError(path, where, f"unknown priority (priorities: {', '.join(PRIORITIES)})")
        if not isinstance(entry, dict):
            raise SpecError(path, where, "must be a table with nice and/or qos")
        unknown = sorted(set(entry) - {"nice", "qos"})
        if unknown:
            raise SpecError(path, f"{where}.{unknown[0]}", "unknown key (known: nice, qos)")
        nice = entry.get("nice")
        if nice is not None:
            _check(path, f"{where}.nice", nice, int, minimum=0)
            if nice > NICE_MAX:
                raise SpecError(path, f"{where}.nice", f"must be at most {NICE_MAX}, got {nice}")
        qos = entry.get("qos")
        if qos is not None:
            _check(path, f"{where}.qos", qos, str)
            if not _SAFE_VALUE.match(qos):
                raise SpecError(path, f"{where}.qos", f"{qos!r} has characters Slurm or a shell would misread")
        out.append((name, nice, qos))
    return tuple(sorted(out, key=lambda p: PRIORITIES.index(p[0])))


def load_profile(name_or_path: str | Path, search_dirs: Path | Sequence[Path] | None = None) -> SlurmProfile:
    """A profile by name (`<name>.toml` from the first folder of `search_dirs` that has it; by default
    the search path of `datafiles`: user, site, packaged), or by path to a .toml file."""
    dirs = None if search_dirs is None else ((search_dirs,) if isinstance(search_dirs, Path) else tuple(search_dirs))
    path = find("profiles", name_or_path, dirs)
    if not path.is_file():
        raise SpecError(path, "", "no such Slurm profile file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, "", f"not valid TOML: {exc}") from None
    profile = profile_from_mapping(data, path, path.stem)
    log.debug("loaded Slurm profile %s from %s", profile.name, path)
    return profile
