"""The environment a process's imports of torch, DeepSpeed and transformers depend on.

A process that imports them once and forks ranks from then on (train/run/rankfork.py for a local
run's ranks, executor/rank_server.py for the local executor's) serves only ranks whose environment
agrees with its own on these variables: they were read when it imported.

Standard library only: common/rank_client.py loads this file by its path, without the package.
"""

from __future__ import annotations

from collections.abc import Mapping

# Read by torch, DeepSpeed, transformers or the Hugging Face hub when they are imported.
IMPORT_TIME_PREFIXES = ("CUDA_", "DS_", "HF_", "HUGGINGFACE_", "MKL_", "OMP_", "PYTHON", "TORCH", "TRANSFORMERS_")


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The part of `env` read at import time."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_PREFIXES)}
