"""The checks of an evaluation asked for (`[[evaluations]]` or `ggpo-batch evaluate`) that read outside
the request: its data file, and the GPUs the run's executor can give it.

Apart from evaluation_spec.py (the contract the job reads), since these checks read the task's data
reader, the `[train]` table and the executor's profiles, which sit above the contracts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contracts.evaluation_spec import evaluation_ranks, file_sha256
from ..errors import SpecError


def check_data(path: str, where: str = "evaluate", field_name: str = "--data",
               train: dict[str, Any] | None = None) -> tuple[str, str, int]:
    """(absolute path, sha256, items) of a data file of items, checked as `[train.data]`'s eval file is
    (train/task/items.py: JSONL or Parquet, ids unique, the task's fields through `[train.data.columns]`
    of the run's `train` table); SpecError (exit 2) names the file, the field and what is wrong."""
    from ..train.config import TrainConfig
    from ..train.task.qa import read_items

    cfg = TrainConfig.from_table(train or {}, "<run spec>")
    absolute = str(Path(path).expanduser().resolve())
    items = read_items(absolute, field_name, where, kind=cfg.kind,
                       columns=cfg.data.columns if cfg.data is not None else None)
    return absolute, file_sha256(absolute), len(items)


def check_gpus(run_spec: dict[str, Any], gpus: int, where: str, field_name: str) -> None:
    """Refuse (SpecError, exit 2) an evaluation on `gpus` GPUs that the run's executor cannot give:
    more GPUs than a node of its Slurm profile, or ranks its vLLM engines' tensor parallelism does
    not divide."""
    from ..train.config import TrainConfig

    executor = run_spec.get("executor")
    cfg = TrainConfig.from_table(run_spec.get("train") or {}, "<run spec>")
    ranks = gpus
    if executor == "slurm":
        from ..executor.profile import load_profile

        profile = load_profile(str(run_spec.get("profile", "default")))
        if gpus > profile.gpus_per_node:
            raise SpecError(where, field_name, f"{gpus} GPUs do not fit a node of profile {profile.name!r} "
                            f"({profile.gpus_per_node} GPUs)")
        ranks = evaluation_ranks(gpus, gpus_per_node=profile.gpus_per_node, tasks_per_node=profile.tasks_per_node)
    elif executor == "debug":
        ranks = 1
    if cfg.rollout == "vllm" and ranks % cfg.tensor_parallel_size:
        raise SpecError(where, field_name, f"{ranks} evaluation rank(s) on {gpus} GPU(s): the run's vLLM engines span "
                        f"train.tensor_parallel_size = {cfg.tensor_parallel_size} ranks; use a multiple of it")
