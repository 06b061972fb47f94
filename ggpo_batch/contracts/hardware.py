"""What an allocation runs on: its accelerators (model, count, memory, driver) and its CPU model.

One probe for GPU and CPU nodes alike. Accelerators come from `nvidia-smi` when it is on the job's
PATH (the only source of the driver version), else from torch.cuda on a CUDA device, else there are
none; the CPU model comes from /proc/cpuinfo. Its readers take their sources as arguments (the
`nvidia-smi` program, the cpuinfo file), so a test points them at other files through the same code.
A probe never fails a run: what cannot be read is None.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NVIDIA_SMI = "nvidia-smi"
CPUINFO = Path("/proc/cpuinfo")
_SMI_QUERY = "--query-gpu=name,memory.total,driver_version"
_SMI_TIMEOUT_S = 20
_CPUINFO_MAX_BYTES = 4 << 20
# The hardware fields that say whether two runs ran on the same kind of machine (node names do not).
COMPARED = ("accelerator", "accelerators", "accelerator_memory_gib", "driver", "cpu")


def probe_hardware(cuda: bool, visible_devices: str | None = None, *, smi: str | None = None,
                   cpuinfo: Path = CPUINFO) -> dict[str, Any]:
    """{"accelerator", "accelerators", "accelerator_memory_gib", "driver", "cpu", "cpus"} of this node.
    `cuda`: torch sees a CUDA device; `visible_devices`: CUDA_VISIBLE_DEVICES (a list restricts the
    query to those GPUs); `smi`: the nvidia-smi program (default: the one on PATH)."""
    gpus = smi_accelerators(smi or shutil.which(NVIDIA_SMI), visible_devices)
    if gpus is None and cuda:
        gpus = torch_accelerators()
    gpus = gpus or []
    names = sorted({g["name"] for g in gpus})
    memory = [g["memory_gib"] for g in gpus if g.get("memory_gib") is not None]
    drivers = sorted({g["driver"] for g in gpus if g.get("driver")})
    return {"accelerator": ", ".join(names) or None, "accelerators": len(gpus),
            "accelerator_memory_gib": min(memory) if memory else None, "driver": ", ".join(drivers) or None,
            "cpu": cpu_model(cpuinfo), "cpus": os.cpu_count()}


def smi_accelerators(program: str | None, visible_devices: str | None = None) -> list[dict[str, Any]] | None:
    """The GPUs `program` (nvidia-smi) lists: name, memory (GiB), driver; None when there is no such
    program or it fails."""
    if not program:
        return None
    argv = [program, _SMI_QUERY, "--format=csv,noheader,nounits"]
    ids = [d.strip() for d in (visible_devices or "").split(",") if d.strip()]
    if ids:
        argv.append("--id=" + ",".join(ids))
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("%s not usable: %s", program, exc)
        return None
    if out.returncode != 0:
        log.warning("%s exited %d: %s", program, out.returncode, out.stderr.strip()[:200])
        return None
    return [g for g in (_smi_line(line) for line in out.stdout.splitlines()) if g is not None]


def _smi_line(line: str) -> dict[str, Any] | None:
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 3 or not parts[0]:
        return None
    try:
        memory = round(float(parts[1]) / 1024, 2)  # MiB
    except ValueError:
        memory = None
    return {"name": parts[0], "memory_gib": memory, "driver": parts[2] or None}


def torch_accelerators() -> list[dict[str, Any]]:
    """The CUDA devices torch sees (no driver version: torch does not say it)."""
    import torch

    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"name": props.name, "memory_gib": round(props.total_memory / 2**30, 2), "driver": None})
    return out


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """The CPU model named in `cpuinfo` (x86 "model name", ARM "Model" or "Hardware"), else the
    platform's processor string; None if neither says."""
    try:
        with open(cpuinfo, "rb") as fh:
            text = fh.read(_CPUINFO_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        text = ""
    found = _field(text.splitlines(), ("model name", "Model", "Hardware", "cpu model"))
    return found or platform.processor() or None


def _field(lines: Sequence[str], keys: Sequence[str]) -> str | None:
    values: dict[str, str] = {}
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys and value.strip():
            values.setdefault(key.strip(), value.strip())
    return next((values[k] for k in keys if k in values), None)
