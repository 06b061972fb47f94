"""The `[train]` table of an experiment spec as a frozen, validated dataclass.

Imports without torch: the CLI validates specs on machines without the train extra. The defaults
(an empty `[train]` table) are the tiny CPU setup that trains a few steps in seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..contracts import spec_fields
from ..errors import SpecError
from .ggpo_config import GgpoConfig
from .task_config import RETRIEVAL_QA, TaskConfig, data_columns, resolve_reward_paths, task_rules

# Every key's default, bounds and meaning: the spec's field table (ggpo_batch/contracts/spec_fields.py).
_D = spec_fields.default
ROLLOUT_BACKENDS: tuple[str, ...] = spec_fields.field("train.rollout").choices
PRECISIONS: tuple[str, ...] = spec_fields.field("train.precision").choices
DTYPES: tuple[str, ...] = spec_fields.field("train.model.dtype").choices
ATTN_IMPLEMENTATIONS: tuple[str, ...] = spec_fields.field("train.model.attn_implementation").choices
# Keys of `[train]` that were renamed: the old name is refused with the new one.
RENAMED_KEYS = {"micro_batch_rows": "micro_batch_size"}
# Keys that shape the built-in byte GPT-2 only: meaningless beside [train.model].
BUILTIN_MODEL_KEYS = ("n_embd", "n_layer", "n_head", "n_positions")
DATA_KEYS = tuple(f.name for f in spec_fields.fields_of("train.data"))
# Tokens; left out of a spec, the model's own (spec_defaults.py).
MAX_MODEL_LEN_RANGE = (spec_fields.field("train.model.max_model_len").lo, spec_fields.most("train.model.max_model_len"))
OLD_LOGPROBS: tuple[str, ...] = spec_fields.field("train.old_logprobs").choices
# Switches whose default is the device's choice: true, false, or "auto" (the default, None here).
AUTO, AUTO_KEYS = "auto", ("vllm_enforce_eager",)


@dataclass(frozen=True)
class ModelConfig:
    """`[train.model]`: a pretrained Hugging Face causal LM (a local directory, or a hub id found in the
    local Hugging Face cache; nothing is downloaded) with its tokenizer and chat template."""

    path: str
    dtype: str = _D("train.model.dtype")
    gradient_checkpointing: bool = _D("train.model.gradient_checkpointing")
    attn_implementation: str = _D("train.model.attn_implementation")
    # Prompt + every turn + tool output of one trajectory, in tokens. Left out of a spec: the model's own
    # context (spec_defaults.py puts it in the run spec); 4096 only for a run spec that lacks it.
    max_model_len: int = _D("train.model.max_model_len")
    # Keywords of the chat template, passed wherever a prompt is rendered (train/chat_template.py:
    # `{ enable_thinking = false }` for a Qwen3-class hybrid template; preflight refuses a thinking
    # switch left at its default and a keyword the template never reads).
    chat_template_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Any, path: str) -> ModelConfig:
        from .pretrained.chat_template import validate_kwargs

        t = _subtable(table, path, "model")
        if "path" not in t:
            raise SpecError(path, "train.model.path", "is required (a Hugging Face checkpoint directory)")
        values = {k: validate_kwargs(v, path) if k == "chat_template_kwargs" else
                  _coerce(v, getattr(cls, k, ""), path, f"model.{k}") for k, v in t.items()}
        cfg = cls(**values)
        if not cfg.path.strip():
            raise SpecError(path, "train.model.path", "must not be empty")
        if cfg.dtype not in DTYPES:
            raise SpecError(path, "train.model.dtype", f"must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
        if cfg.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise SpecError(path, "train.model.attn_implementation",
                            f"must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {cfg.attn_implementation!r}")
        lo, hi = MAX_MODEL_LEN_RANGE
        if not lo <= cfg.max_model_len <= hi:
            raise SpecError(path, "train.model.max_model_len", f"must be in {lo}..{hi}, got {cfg.max_model_len}")
        return cfg


@dataclass(frozen=True)
class DataConfig:
    """`[train.data]`: JSONL or Parquet files, by suffix (format in docs/researcher.md, "Real models and data");
    `columns` maps the task's fields to the files' columns. Exposure arms take their held-out items from `eval`."""

    train: str
    eval: str
    passages: str | None = None  # retrieval QA's (required there); refused for a single-turn task
    columns: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Any, path: str) -> DataConfig:
        t = _subtable(table, path, "data")
        for key in ("train", "eval"):
            if key not in t:
                raise SpecError(path, f"train.data.{key}", "is required (a JSONL or Parquet file)")
        values: dict[str, Any] = {}
        for key, value in t.items():
            if key == "columns":
                values[key] = data_columns(value, path)
                continue
            values[key] = _coerce(value, "", path, f"data.{key}")
            if not values[key].strip():
                raise SpecError(path, f"train.data.{key}", "must not be empty")
        return cls(**values)


def _subtable(table: Any, path: str, name: str) -> Mapping[str, Any]:
    if not isinstance(table, Mapping):
        raise SpecError(path, f"train.{name}", f"must be a table ([train.{name}])")
    known = spec_fields.keys(f"train.{name}")
    for key in table:
        if key not in known:
            raise SpecError(path, f"train.{name}.{key}", f"unknown key (known: {', '.join(sorted(known))})")
    return table


def resolve_paths(table: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The `[train]` table with `model.path` and the `data` files made absolute: `~` expanded and
    relative paths taken from `base` (the spec file's folder), so the run spec names the same files
    wherever the job runs. A model path that is not a directory and reads as a hub id ("org/name")
    is kept: it is resolved from the local Hugging Face cache where the model is loaded."""
    from .pretrained.hf import looks_like_hub_id

    out = dict(table)

    def absolute(value: Any, hub_ok: bool) -> Any:
        if not isinstance(value, str) or not value.strip():
            return value
        p = Path(value).expanduser()
        if p.is_absolute():
            return str(p)
        if hub_ok and looks_like_hub_id(value) and not (base / p).exists():
            return value
        return str((base / p).resolve())

    if isinstance(table.get("model"), Mapping):
        model = dict(table["model"])
        if "path" in model:
            model["path"] = absolute(model["path"], hub_ok=True)
        out["model"] = model
    if isinstance(table.get("data"), Mapping):
        out["data"] = {k: v if k == "columns" else absolute(v, hub_ok=False) for k, v in table["data"].items()}
    if isinstance(table.get("task"), Mapping):
        out["task"] = resolve_reward_paths(table["task"], lambda v: absolute(v, hub_ok=False))
    return out


@dataclass(frozen=True)
class TrainConfig(GgpoConfig):
    """Everything the training job needs beyond the arm, seed and budget of the run spec; the ggpo
    hyperparameters (group_size, clip_epsilon, kl_coef, reference_refresh_steps, advantage_eps)
    come from GgpoConfig."""

    # Policy model: `[train.model]` (a pretrained checkpoint) or, without it, the built-in GPT-2
    # below, built from config over the byte vocabulary (no download; the nightly tier, CPU tests).
    model: ModelConfig | None = None
    data: DataConfig | None = None  # `[train.data]` files; without it the generated corpus (task.synthetic)
    task: TaskConfig | None = None  # `[train.task]`; without it retrieval QA and its verifier
    n_embd: int = _D("train.n_embd")
    n_layer: int = _D("train.n_layer")
    n_head: int = _D("train.n_head")
    n_positions: int = _D("train.n_positions")
    # Rollouts.
    prompts_per_step: int = _D("train.prompts_per_step")  # groups per step, over all ranks (split evenly)
    exposures_per_step: int = _D("train.exposures_per_step")  # exposure slots per step in exposure arms
    max_new_tokens: int = _D("train.max_new_tokens")  # per generation call (turn)
    max_turns: int = _D("train.max_turns")  # generation calls per trajectory (search turns + answer)
    temperature: float = _D("train.temperature")
    rollout: str = _D("train.rollout")
    vllm_gpu_memory_utilization: float = _D("train.vllm_gpu_memory_utilization")
    # vLLM's eager mode: None ("auto", the default) is the device's choice (vllm_backend.engine_options:
    # CUDA graphs on a GPU, eager on the CPU); true or false overrides it.
    vllm_enforce_eager: bool | None = _D("train.vllm_enforce_eager")
    # Ranks per colocated vLLM engine (train/vllm_backend.py): 1, 2 or 4 on a 4-GPU node; it must divide
    # the training ranks, and world / tensor_parallel_size engines sample side by side.
    tensor_parallel_size: int = _D("train.tensor_parallel_size")
    # Engine and optimisation.
    zero_stage: int = _D("train.zero_stage")
    precision: str = _D("train.precision")  # bf16 on GPU, fp32 on CPU
    lr: float = _D("train.lr")
    micro_batch_size: int = _D("train.micro_batch_size")  # trajectories per forward/backward pass (gradients accumulate); 0 = the rank's whole batch
    # Padded tokens per pass (train/passes.py packs the rank's rows into as few passes as fit); 0 = the
    # memory estimate's rows_per_pass x max_model_len.
    max_tokens_per_pass: int = _D("train.max_tokens_per_pass")
    # Log-probs (train/logprobs.py): masked tokens x vocabulary rows of the LM head per chunk; 0 tokens =
    # full logits (no chunking). The default chunk's float32 logits take 32 MiB.
    logprob_chunk_tokens: int = _D("train.logprob_chunk_tokens")
    logprob_chunk_vocab: int = _D("train.logprob_chunk_vocab")
    grad_clip: float = _D("train.grad_clip")
    # PPO's "old" log-probs (train/ggpo.py): "policy" takes the policy's before the update (verl), which
    # with one optimizer step a batch are the update's own forward's, detached (run/trainer.py
    # `_old_logprobs`); "rollout" uses the engine's, through a truncated importance-sampling weight
    # min(exp(policy - rollout), rollout_is_cap) per token (TRL's vllm_importance_sampling_correction).
    old_logprobs: str = _D("train.old_logprobs")
    rollout_is_cap: float = _D("train.rollout_is_cap")
    aux_coef: float = _D("train.aux_coef")
    max_steps: int = _D("train.max_steps")  # 0 = no cap: the loop-time budget alone ends training
    checkpoint_every: int = _D("train.checkpoint_every")  # steps between resumable checkpoints; 0 = only on SIGUSR1/SIGTERM
    # Consecutive failed weight-sync probes that stop the run (a failed baseline stops it at once).
    max_failed_probes: int = _D("train.max_failed_probes")
    # Task.
    synthetic_entities: int = _D("train.synthetic_entities")
    synthetic_eval_items: int = _D("train.synthetic_eval_items")
    synthetic_unsupported_fraction: float = _D("train.synthetic_unsupported_fraction")
    retrieval_top_k: int = _D("train.retrieval_top_k")
    passage_max_bytes: int = _D("train.passage_max_bytes")  # each retrieved passage is cut to this many bytes of text
    # Evaluation (train/evaluation.py): the first eval_size held-out items (0 = all of them), greedy
    # at eval_temperature 0, else eval_samples sampled answers per item, rewards averaged.
    eval_size: int = _D("train.eval_size")
    eval_temperature: float = _D("train.eval_temperature")
    eval_samples: int = _D("train.eval_samples")

    def __post_init__(self) -> None:
        pass  # validated by from_table with the spec's path in every message (`_validate`)

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str) -> TrainConfig:
        """Parse and validate a `[train]` table; bad input raises SpecError(path, "train.<key>", ...)."""
        if not isinstance(table, Mapping):
            raise SpecError(path, "train", "must be a table")
        known = spec_fields.keys("train")  # the spec's field table; each is a field of this class
        declared = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key in RENAMED_KEYS:
                raise SpecError(path, f"train.{key}", f"was renamed: write train.{RENAMED_KEYS[key]} = {value!r} instead")
            if key not in known:
                raise SpecError(path, f"train.{key}", f"unknown key (known: {', '.join(sorted(known))})")
            if key == "model":
                values[key] = ModelConfig.from_table(value, path)
            elif key == "data":
                values[key] = DataConfig.from_table(value, path)
            elif key == "task":
                values[key] = TaskConfig.from_table(value, path)
            elif key in AUTO_KEYS:
                if value != AUTO and not isinstance(value, bool):
                    raise SpecError(path, f"train.{key}", f"must be true, false or \"{AUTO}\", got {value!r}")
                values[key] = None if value == AUTO else value
            else:
                values[key] = _coerce(value, declared[key].default, path, key)
        if "model" in values:
            for key in BUILTIN_MODEL_KEYS:
                if key in values:
                    raise SpecError(path, f"train.{key}", "shapes the built-in model only; with [train.model] the "
                                    "checkpoint's config decides")
            if values.get("precision", "auto") != "auto":
                raise SpecError(path, "train.precision", "with [train.model] the precision is train.model.dtype")
        if "rollout_is_cap" in values and values.get("old_logprobs", cls.old_logprobs) != "rollout":
            raise SpecError(path, "train.rollout_is_cap", "applies to train.old_logprobs = \"rollout\" only")
        task_rules(values, path)
        cfg = cls(**values)
        cfg._validate(path)
        return cfg

    def to_table(self) -> dict[str, Any]:
        """The `[train]` table this config reads back from (sub-tables only when set)."""
        table = dataclasses.asdict(self)
        for key in ("model", "data", "task", *AUTO_KEYS):
            if table[key] is None:
                del table[key]
        if self.task is not None:
            t = table["task"]
            table["task"] = {"kind": t["kind"], "reward": list(t["rewards"]), "reward_weights": list(t["weights"]),
                             "reward_timeout_seconds": t["reward_timeout_seconds"]}
        if self.data is not None:
            for key in ("passages", "columns"):
                if not table["data"][key]:
                    del table["data"][key]
        if self.model is not None:
            for key in BUILTIN_MODEL_KEYS:
                del table[key]
        if self.old_logprobs != "rollout":
            del table["rollout_is_cap"]
        return table

    @property
    def kind(self) -> str:
        """The task's kind: `[train.task] kind`, retrieval QA without it."""
        return self.task.kind if self.task is not None else RETRIEVAL_QA

    @property
    def max_model_len(self) -> int:
        """Tokens one trajectory may hold: train.model.max_model_len, or the built-in model's n_positions."""
        return self.model.max_model_len if self.model is not None else self.n_positions

    def _validate(self, path: str) -> None:
        def bad(key: str, problem: str) -> None:
            raise SpecError(path, f"train.{key}", problem)

        # Each key's bounds and choices (the ggpo hyperparameters' among them): the spec's field table.
        for f in spec_fields.fields_of("train"):
            problem = None if f.name in ("model", "data", "task") else f.problem(getattr(self, f.name))
            if problem is not None:
                bad(f.name, problem)
        if self.eval_temperature == 0 and self.eval_samples != 1:
            bad("eval_samples", "must be 1 when eval_temperature = 0 (greedy decoding gives one answer)")
        if self.n_embd % self.n_head:
            bad("n_head", f"must divide n_embd={self.n_embd}")
        if self.vllm_enforce_eager is not None and self.rollout != "vllm":
            bad("vllm_enforce_eager", "applies to the vLLM engines: set train.rollout = \"vllm\" or leave it out")
        if self.tensor_parallel_size > 1 and self.rollout != "vllm":
            bad("tensor_parallel_size", "applies to the vLLM engines: set train.rollout = \"vllm\" or leave it at 1")
        if self.model is None:
            # Prompt + turns of generation + retrieved passages must fit the built-in model's context.
            # (With [train.model], preflight measures the prompts with the checkpoint's tokenizer.)
            need = 96 + self.max_turns * (self.max_new_tokens + self.retrieval_top_k * (self.passage_max_bytes + 2))
            if need > self.n_positions:
                bad("n_positions",
                    f"{self.n_positions} is too small for max_turns/max_new_tokens/retrieval (needs ~{need})")


def resolve_defaults(table: Mapping[str, Any]) -> dict[str, Any]:
    """The `[train]` table with the defaults that decide what a run computes written out (an omitted
    `old_logprobs` is "policy"; with "rollout", an omitted `rollout_is_cap` its default), so that the
    run spec's config hash says which was used and a later change of default cannot hide in it."""
    out = dict(table)
    out.setdefault("old_logprobs", TrainConfig.old_logprobs)
    if out["old_logprobs"] == "rollout":
        out.setdefault("rollout_is_cap", TrainConfig.rollout_is_cap)
    return out


def _coerce(value: Any, default: Any, path: str, key: str) -> Any:
    kind = type(default) if default is not dataclasses.MISSING else str
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
