"""Experiments whose runs succeeded, with the files a training job leaves for an evaluation after
training (its details: the exported policy's folder and the trained item ids), and data files of
items, for the evaluation tests."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ggpo_batch.contracts.allocation import attempt_folder, details_path, policy_of, record_path
from ggpo_batch.ledger import NewRun

TRAINED = ["syn-0001", "syn-0002", "syn-0003"]  # what every run below trained on


def items_file(path: Path, ids: Iterable[str]) -> Path:
    """A data file of items in [train.data]'s eval format."""
    path.write_text("".join(json.dumps({"id": i, "question": f"What is {i}?", "answers": [f"ans {i}"],
                                        "support_titles": [f"{i} (fact)"]}) + "\n" for i in ids))
    return path


def run_spec(key: str, arm: str, seed: int, **extra: Any) -> dict[str, Any]:
    """A run spec as the ledger keeps it (runspec.RunSpec.to_dict), on the local executor."""
    return {"run_key": key, "experiment": key.split("-v")[0], "experiment_version": 1, "method": "ggpo", "seed": seed,
            "gpus": 4, "loop_budget_seconds": 1.0, "executor": "local", "profile": "default", "retries": 0,
            "train": {}, "version": 1, "arm": {"name": arm, "exposure": "none", "exposed_items": 0, "templates": [],
                                               "auxiliary_answer_loss": False}, **extra}


def training_files(jobs_dir: Path, key: str, number: int = 1, *, trained: list[str] | None = TRAINED) -> Path:
    """The attempt folder of a training job: details naming its exported policy (an existing folder)
    and, unless `trained` is None, the trained item ids."""
    folder = attempt_folder(jobs_dir, key, number)
    folder.mkdir(parents=True, exist_ok=True)
    policy = policy_of(record_path(folder))
    policy.mkdir(exist_ok=True)
    details: dict[str, Any] = {"run_key": key, "policy_dir": str(policy)}
    if trained is not None:
        details["trained_item_ids"] = trained
    details_path(folder).write_text(json.dumps(details))
    return folder


def succeeded_experiment(ledger, jobs_dir: Path, name: str, *, arms: Iterable[str] = ("clean",),  # type: ignore[no-untyped-def]
                         seeds: Iterable[int] = (1, 2), gpus: int = 4, outcome: Any = None,
                         queue: str | None = None) -> list[str]:
    """An experiment whose runs trained (one attempt each, 0.01 GPU-h) and succeeded, with their
    training files; `outcome(arm, seed)` gives each run's training outcome. Returns the run keys."""
    keys = []
    runs = []
    for arm in arms:
        for seed in seeds:
            key = f"{name}-v1-{seed}-{arm}"
            keys.append(key)
            runs.append(NewRun(run_key=key, arm=arm, seed=seed, config_hash="h", run_spec=run_spec(key, arm, seed)))
    ledger.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=name, spec={}, gpus=gpus,
                             actor="t", runs=runs, queue=queue)
    for r in runs:
        ledger.begin_attempt(r.run_key, executor="local", gpus=gpus, actor="w", worker="w")
        ledger.mark_submitted(r.run_key, 1, job_id=f"{r.run_key}-job", actor="w")
        ledger.mark_finished(r.run_key, 1, attempt_state="succeeded", run_state="succeeded", actor="w",
                             gpu_hours_job=0.01, result={"arm": r.arm, "seed": r.seed},
                             outcome=outcome(r.arm, r.seed) if outcome else None)
        training_files(jobs_dir, r.run_key)
    return keys
