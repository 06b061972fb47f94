"""The allocation a spec gets: its training ranks and one GPU's bytes, from its executor and profile.

Shared by the preflight (which reports the problems) and the spec's defaults (which size
`max_model_len` to the GPU), so neither imports the other.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..train.policy.gpu_memory import GIB

if TYPE_CHECKING:
    from .experiment import ExperimentSpec


def allocation(spec: ExperimentSpec, profiles_dir: Path | None = None) -> tuple[int, float | None,
                                                                                list[tuple[str, str]]]:
    """(training ranks, bytes of one GPU or None when unknown or no GPU, problems as (field, message))
    for the spec's executor and profile."""
    if spec.executor == "debug":
        return 1, None, []
    if spec.executor == "local":  # CPU ranks on the worker's machine, as many as make_executor gives it
        from ..executor import make_executor

        return int(inspect.signature(make_executor).parameters["local_tasks"].default), None, []
    from ..executor.profile import load_profile

    try:
        profile = load_profile(spec.profile, profiles_dir)  # None: the profile search path (datafiles.py)
    except SpecError as exc:
        return spec.gpus, None, [("experiment.profile", exc.message)]
    problems = []
    if spec.gpus != profile.gpus_per_node:
        problems.append(("experiment.gpus", (f"{spec.gpus} GPUs, but profile {profile.name!r} allocates "
                                             f"{profile.gpus_per_node} per run (gpus_per_node)")))
    if spec.nodes != profile.nodes:
        problems.append(("experiment.nodes", (f"{spec.nodes} nodes, but profile {profile.name!r} allocates "
                                              f"{profile.nodes} per run (nodes)")))
    gib = getattr(profile, "gpu_memory_gib", None)
    return profile.tasks_per_node * profile.nodes, (gib * GIB if gib else None), problems
