"""The `[train]` table of an experiment spec as a frozen, validated dataclass.

Imports without torch: the CLI validates specs on machines without the train extra. The defaults
(an empty `[train]` table) are the tiny CPU setup that trains a few steps in seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import SpecError
from .ggpo_config import GgpoConfig

ROLLOUT_BACKENDS = ("torch", "vllm")
TASKS = ("synthetic", "jsonl")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig(GgpoConfig):
    """Everything the training job needs beyond the arm, seed and budget of the run spec; the ggpo
    hyperparameters (group_size, clip_epsilon, kl_coef, reference_refresh_steps, advantage_eps)
    come from GgpoConfig."""

    # Policy model: a GPT-2 built from this config (byte-level vocabulary, no download).
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_positions: int = 512
    # Rollouts.
    prompts_per_step: int = 4  # groups per step, over all ranks (split evenly)
    exposures_per_step: int = 2  # exposure slots per step in exposure arms
    max_new_tokens: int = 16  # per generation call (turn)
    max_turns: int = 2  # generation calls per trajectory (search turns + answer)
    temperature: float = 1.0
    rollout: str = "torch"
    vllm_gpu_memory_utilization: float = 0.3
    # Engine and optimisation.
    zero_stage: int = 2
    precision: str = "auto"  # bf16 on GPU, fp32 on CPU
    lr: float = 1e-3
    grad_clip: float = 1.0
    aux_coef: float = 1.0
    max_steps: int = 0  # 0 = no cap: the loop-time budget alone ends training
    checkpoint_every: int = 0  # steps between resumable checkpoints; 0 = only on SIGUSR1/SIGTERM
    # Task.
    task: str = "synthetic"
    train_path: str = ""  # jsonl task: {"question", "answer", "support_title"} per line
    eval_path: str = ""
    corpus_path: str = ""  # jsonl task: {"title", "text"} per line
    synthetic_entities: int = 64
    synthetic_eval_items: int = 24
    synthetic_unsupported_fraction: float = 0.3
    retrieval_top_k: int = 2
    passage_max_bytes: int = 64
    # Evaluation (train/evaluation.py): the first eval_size held-out items (0 = all of them), greedy
    # at eval_temperature 0, else eval_samples sampled answers per item, rewards averaged.
    eval_size: int = 0
    eval_temperature: float = 0.0
    eval_samples: int = 1

    def __post_init__(self) -> None:
        pass  # validated by from_table with the spec's path in every message (`_validate`)

    def to_table(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str) -> TrainConfig:
        """Parse and validate a `[train]` table; bad input raises SpecError(path, "train.<key>", ...)."""
        if not isinstance(table, Mapping):
            raise SpecError(path, "train", "must be a table")
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in known:
                raise SpecError(path, f"train.{key}", f"unknown key (known: {', '.join(sorted(known))})")
            default = known[key].default
            values[key] = _coerce(value, default, path, key)
        cfg = cls(**values)
        cfg._validate(path)
        return cfg

    def _validate(self, path: str) -> None:
        def bad(key: str, problem: str) -> None:
            raise SpecError(path, f"train.{key}", problem)

        for key, problem in self.ggpo_problems():
            bad(key, problem)
        for key in ("n_embd", "n_layer", "n_head", "n_positions", "prompts_per_step", "max_new_tokens",
                    "max_turns", "retrieval_top_k", "passage_max_bytes",
                    "eval_samples", "synthetic_entities", "synthetic_eval_items"):
            if getattr(self, key) < 1:
                bad(key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("exposures_per_step", "max_steps", "checkpoint_every", "eval_size", "eval_temperature"):
            if getattr(self, key) < 0:
                bad(key, f"must be >= 0, got {getattr(self, key)}")
        if self.eval_temperature == 0 and self.eval_samples != 1:
            bad("eval_samples", "must be 1 when eval_temperature = 0 (greedy decoding gives one answer)")
        if self.n_embd % self.n_head:
            bad("n_head", f"must divide n_embd={self.n_embd}")
        for key in ("aux_coef", "grad_clip"):
            if getattr(self, key) < 0:
                bad(key, "must be >= 0")
        if self.lr <= 0:
            bad("lr", "must be > 0")
        if self.temperature <= 0:
            bad("temperature", "must be > 0 (ggpo needs sampled rollouts)")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            bad("vllm_gpu_memory_utilization", "must be in (0, 1]")
        if not 0 <= self.synthetic_unsupported_fraction < 1:
            bad("synthetic_unsupported_fraction", "must be in [0, 1)")
        if self.zero_stage not in (2, 3):
            bad("zero_stage", f"must be 2 or 3, got {self.zero_stage}")
        if self.rollout not in ROLLOUT_BACKENDS:
            bad("rollout", f"must be one of {', '.join(ROLLOUT_BACKENDS)}, got {self.rollout!r}")
        if self.precision not in PRECISIONS:
            bad("precision", f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.task not in TASKS:
            bad("task", f"must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.task == "jsonl":
            for key in ("train_path", "eval_path", "corpus_path"):
                if not getattr(self, key):
                    bad(key, "is required when task = \"jsonl\"")
        # Prompt + turns of generation + retrieved passages must fit the model's context.
        need = 96 + self.max_turns * (self.max_new_tokens + self.retrieval_top_k * (self.passage_max_bytes + 2))
        if need > self.n_positions:
            bad("n_positions", f"{self.n_positions} is too small for max_turns/max_new_tokens/retrieval (needs ~{need})")


def _coerce(value: Any, default: Any, path: str, key: str) -> Any:
    kind = type(default)
    if kind is bool:
        if not isinstance(value, bool):
            raise SpecError(path, f"train.{key}", f"must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(path, f"train.{key}", f"must be an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(path, f"train.{key}", f"must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise SpecError(path, f"train.{key}", f"must be a string, got {value!r}")
    return value
