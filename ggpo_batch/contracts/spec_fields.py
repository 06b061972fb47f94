"""The experiment spec's fields: one table of every key a spec may hold, with its type, default,
limit and one-line meaning.

The parser takes from it the keys it knows, their defaults, and the bounds and choices of each
(`spec.py` for `[experiment]`, `[overheads]`, `[arms.*]`; `evaluation_spec.py` for
`[[evaluations]]`; `train/config.py` and `train/ggpo_config.py` for `[train]` and its sub-tables);
rules between keys stay in their parsers and are stated here in words. The reference page
`docs/reference/spec.md` is generated from this table (`python -m ggpo_batch.contracts.spec_fields
--markdown`), and tests/test_spec_fields.py checks both the page and the parser against it.
Imports only leaf modules: the control plane and the training job both read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..common import limits
from .outcome import OUTCOME_METRICS
from .priorities import DEFAULT_PRIORITY, PRIORITIES
from .run_record import PAIRED_RECORD_METRICS, TOKEN_METRICS


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()  # the default of a key the spec must give
DAYS_30 = 30 * 24 * 3600.0


@dataclass(frozen=True)
class Field:
    """One key of a spec. `key` is its place: `experiment.gpus`, `arms.<arm>.exposure`,
    `train.model.dtype`, `evaluations[].gpus`; `default` is REQUIRED, None (absent: the meaning says
    what then) or the value taken when the key is left out."""

    key: str
    type: str  # integer | number | string | boolean | table | array of ... | true, false or "auto"
    default: Any
    meaning: str
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False  # lo itself is refused
    open_hi: bool = False
    choices: tuple[Any, ...] = ()
    max_items: int | None = None  # an array's (or table's) entries
    why: str = ""  # said with a value out of bounds
    rule: str = ""  # a limit no bound says: a name's characters, a rule between keys
    shown_default: str = ""  # the default in words, where the value alone would mislead

    @property
    def section(self) -> str:
        return self.key.rpartition(".")[0]

    @property
    def name(self) -> str:
        return self.key.rpartition(".")[2]

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` by this field's bounds and choices (None: nothing); the type and
        the rules between keys are the parser's."""
        got = f", got {value!r}"
        why = f" ({self.why})" if self.why else ""
        if self.choices:
            return None if value in self.choices else f"must be {_choices_text(self.choices)}{why}{got}"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.lo is None and self.hi is None):
            return None
        low_ok = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        high_ok = self.hi is None or (value < self.hi if self.open_hi else value <= self.hi)
        if low_ok and high_ok and not (isinstance(value, float) and math.isnan(value)):
            return None
        return f"must be {self.bounds_text()}{why}{got}"

    def bounds_text(self) -> str:
        """`in 1..64` (integers), `in (0, 1]` (numbers), `>= 1`, `> 0`."""
        if self.lo is not None and self.hi is not None:
            if self.type.endswith("integers"):
                return f"each in {_number(self.lo)}..{_number(self.hi)}"
            if self.type == "integer":
                return f"in {_number(self.lo)}..{_number(self.hi)}"
            return (f"in {'(' if self.open_lo else '['}{_number(self.lo)}, {_number(self.hi)}"
                    f"{')' if self.open_hi else ']'}")
        if self.lo is not None:
            return f"{'>' if self.open_lo else '>='} {_number(self.lo)}"
        return f"{'<' if self.open_hi else '<='} {_number(self.hi or 0)}"

    def limit_text(self) -> str:
        """The limit as the reference states it."""
        parts = []
        if self.choices:
            parts.append(" \\| ".join(f"`{_toml(c)}`" for c in self.choices))
        elif self.lo is not None or self.hi is not None:
            parts.append(self.bounds_text())
        if self.max_items is not None:
            parts.append(f"at most {self.max_items:,} entries")
        if self.rule:
            parts.append(self.rule)
        return "; ".join(parts)

    def default_text(self) -> str:
        if self.shown_default:
            return self.shown_default
        if self.default is REQUIRED:
            return "required"
        if self.default is None:
            return "none"
        return f"`{_toml(self.default)}`"


def _number(x: float) -> str:
    """1, 0.3, 2,592,000; a power of ten from a million on as 1e6; 2^63 - 1 in full."""
    if not float(x).is_integer():
        return f"{x:g}"
    n = int(x)
    if n == limits.INT_MAX:
        return "2^63-1"
    digits = str(abs(n))
    if abs(n) >= 10**6 and digits.strip("0") == "1":
        return f"{'-' if n < 0 else ''}1e{len(digits) - 1}"
    return f"{n:,}"


def _choices_text(choices: Sequence[Any]) -> str:
    if all(isinstance(c, str) for c in choices):
        return f"one of {', '.join(choices)}"
    shown = [str(c) for c in choices]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return str(value)


F = Field
_NAME = limits.NAME_RULE
# The table. The order is the reference page's.
FIELDS: tuple[Field, ...] = (
    # -- the top level -------------------------------------------------------------------------------
    F("schema", "integer", 1, "The spec format this file is written in.", choices=(1,)),
    F("experiment", "table", REQUIRED, "What the experiment is and where its runs go (below)."),
    F("overheads", "table", None, "Seconds outside the loop, inside the allocation (below).",
      shown_default="the defaults below"),
    F("arms", "table of tables", REQUIRED, "One `[arms.<arm>]` table per arm (below).", max_items=64,
      rule=f"at least one, unless a `[sweep]` makes them; arm names: {limits.ARM_NAME_RULE}"),
    F("train", "table", None, "The training job's settings (below).", shown_default="the defaults below"),
    F("sweep", "table", None, "Training fields swept over a grid: each point is an arm, added to the `[arms.*]` "
      "(below).", max_items=8, shown_default="none", rule="explicit and swept arms together at most 64"),
    F("evaluations", "array of tables", None, "`[[evaluations]]`: evaluations after training (below).",
      max_items=16, shown_default="none"),
    F("power", "table", None, "`[power]`: the effect the seeds must detect and how (below); `plan`, `advise` and "
      "`report` read it. Part of the spec's hash when present.", shown_default="none (plan with options)"),
    # -- [experiment] --------------------------------------------------------------------------------
    F("experiment.name", "string", REQUIRED, "The experiment's name: `status`, `report` and run keys use it.",
      rule=_NAME),
    F("experiment.method", "string", REQUIRED, "The post-training method.", choices=("ggpo",)),
    F("experiment.description", "string", "", "Free text, shown with the experiment.",
      rule=f"UTF-8, no NUL, at most {limits.TEXT_MAX:,} characters"),
    F("experiment.seeds", "array of integers", REQUIRED, "One run per seed and arm.", lo=limits.SEED_MIN,
      hi=limits.SEED_MAX, max_items=1000, rule="distinct, at least one"),
    F("experiment.gpus", "integer", 4, "GPUs per node of one run's allocation.", lo=1, hi=64,
      rule="must match the Slurm profile's"),
    F("experiment.nodes", "integer", 1, "Nodes of one run's allocation.", lo=1, hi=64,
      rule="more than 1 needs `executor = \"slurm\"`; must match the Slurm profile's"),
    F("experiment.loop_budget_seconds", "number", 2700.0, "The training loop's time budget, the same for every arm.",
      lo=0, hi=DAYS_30, open_lo=True),
    F("experiment.executor", "string", "slurm", "Where runs are allocated: a Slurm cluster, processes on this "
      "machine, or a process the worker forks for it (tests).", choices=("slurm", "local", "debug")),
    F("experiment.profile", "string", "default", "The Slurm profile: `NAME.toml` in "
      "`~/.config/ggpo-batch/profiles/`, `/etc/ggpo-batch/profiles/`, then the packaged ones.", rule=_NAME),
    F("experiment.max_gpu_hours", "number", None, "The cost guard refuses an experiment estimated over this.",
      lo=0, hi=limits.GPU_HOURS_MAX, open_lo=True, shown_default="none (no cap)"),
    F("experiment.retries", "integer", 0, "Automatic retries of a run, for infrastructure causes only "
      "(preemption, node failure, a lost worker or allocation).", lo=0, hi=10),
    F("experiment.queue", "string", None, "The queue its runs wait on.", rule=_NAME,
      shown_default="`GGPO_QUEUE` (`ggpo`)"),
    F("experiment.continue_on_timeout", "boolean", False, "At the allocation's time limit: checkpoint, then "
      "continue in a new allocation."),
    F("experiment.max_continuations", "integer", 3, "Continuations of one run at most.", lo=0, hi=100),
    F("experiment.keep_checkpoints", "boolean", False, "Keep a run's checkpoint once its record is booked "
      "(else removed)."),
    F("experiment.baseline", "string", None, "The arm every other arm is paired against (report, dashboard, "
      "plan, advise; `report --baseline` overrides).", rule="an arm of the spec",
      shown_default="`clean` if there is such an arm, else the first arm"),
    F("experiment.canary", "boolean", None, "Run one short canary allocation per distinct (model, rollout, ZeRO "
      "stage, tensor parallel size) before the sweep; the runs stay held until it passes (docs/researcher.md).",
      shown_default='true for `executor = "slurm"` with `rollout = "vllm"` and at least 4 runs in the enqueue, '
                    'else false'),
    F("experiment.canary_gpus", "integer", None, "GPUs of one canary's allocation (one node).", lo=1, hi=64,
      shown_default="the runs' GPUs per node"),
    F("experiment.canary_minutes", "number", None, "The canary allocation's time limit, in minutes.", lo=1,
      hi=24 * 60, shown_default="20"),
    F("experiment.priority", "string", DEFAULT_PRIORITY, "Which runs workers take first (`enqueue --priority` "
      "overrides); not part of the spec's hash.", choices=PRIORITIES),
    # -- [overheads] ---------------------------------------------------------------------------------
    F("overheads.setup_export_seconds", "number", 600.0, "Setup and export, for the cost estimate.", lo=0,
      hi=DAYS_30),
    F("overheads.audit_seconds", "number", 30.0, "The rollout audit, for the cost estimate.", lo=0, hi=DAYS_30),
    F("overheads.evaluation_seconds", "number", 60.0, "Evaluation, for the cost estimate.", lo=0, hi=DAYS_30),
    # -- [arms.<arm>] --------------------------------------------------------------------------------
    F("arms.<arm>.exposure", "string", "none", "How held-out evaluation items enter training: not at all, each "
      "through every template in one shared group, or the same number of unpaired exposures.",
      choices=("none", "paired", "random")),
    F("arms.<arm>.exposed_items", "integer", 0, "Held-out items exposed.", lo=0, hi=10_000_000,
      rule="> 0 unless `exposure = \"none\"`"),
    F("arms.<arm>.templates", "array of strings", [], "Templates each exposed item is shown through.",
      rule=f"distinct, non-empty, each at most {limits.NAME_MAX} characters; at least one unless "
           "`exposure = \"none\"`"),
    F("arms.<arm>.auxiliary_answer_loss", "boolean", False, "Add a supervised loss on gold answers a "
      "retrieved passage verifies (the `*_answer` arms).", rule="not with `exposure = \"none\"`"),
    F("arms.<arm>.train", "table", None, "This arm's overrides of `[train]` (and, as `[arms.<arm>.train.model]`, "
      "of `[train.model]`), checked as `[train]` is; the arm's run specs hold the spec's `[train]` with them laid "
      "over it.", shown_default="none: the spec's `[train]`",
      rule="not `data`, `task`, `synthetic_*`, `eval_size`, `eval_temperature`, `eval_samples`: arms are paired "
           "on the same items and the same reward"),
    # -- [sweep] -------------------------------------------------------------------------------------
    F("sweep.<field>", "array", REQUIRED, "`\"train.KEY\" = [v1, v2]` or `\"train.model.KEY\" = [...]` (a quoted "
      "dotted key): the values the grid takes; the arm of each point is named after it (`lr_1em06__kl_coef_0p001`, "
      "a short hash suffix when longer than 64) and overrides those fields.", max_items=64,
      rule="distinct values, each valid for its field; not the fields an arm may not override; a name that is "
           "an explicit arm's is refused"),
    # -- [power] -------------------------------------------------------------------------------------
    F("power.metric", "string", "eval_reward", "The metric the arms are compared on: an outcome metric, or a record "
      "metric `report` pairs by seed.", choices=(*OUTCOME_METRICS, *PAIRED_RECORD_METRICS, *TOKEN_METRICS)),
    F("power.direction", "string", "higher", "Which way is better (the sign `advise` calls an improvement); the "
      "test is two-sided either way.", choices=("higher", "lower")),
    F("power.effect", "number", None, "The smallest arm - baseline difference worth detecting, in the metric's "
      "units.", lo=0, open_lo=True, rule="not with `effect_sd`", shown_default="none (plan shows what the seeds "
      "detect)"),
    F("power.effect_sd", "number", None, "The same as d_z: the difference over the sd of the paired differences.",
      lo=0, hi=100, open_lo=True, rule="not with `effect`", shown_default="none"),
    F("power.power", "number", 0.8, "The probability of detecting `effect` that the seeds must reach.", lo=0, hi=1,
      open_lo=True, open_hi=True),
    F("power.alpha", "number", 0.05, "Two-sided, for the whole family of arms against the baseline.", lo=0, hi=0.5,
      open_lo=True),
    F("power.multiplicity", "string", "holm", "The correction over the arms (planned at alpha / arms unless "
      "`none`).", choices=("holm", "bonferroni", "none")),
    F("power.sigma", 'number or "ledger"', "ledger", "The sd of the paired differences: pooled from the ledger's "
      "earlier experiments of the method and metric, or this number.", lo=0, open_lo=True),
    F("power.design", "string", "fixed", "All seeds at once, or in waves with a look after each (Lan-DeMets "
      "alpha-spending): `enqueue` queues the first wave and holds the later ones, reconcile takes each look and "
      "releases the next wave or stops an arm.",
      choices=("fixed", "sequential")),
    F("power.waves", "array of integers", [], "Seeds at each look, increasing; the last is `max(waves)`.", lo=2,
      max_items=20, rule="`design = \"sequential\"` only, and then required; at most as many as `experiment.seeds` "
      "(`enqueue`: exactly as many, the seeds of the waves in the order they run)"),
    F("power.spending", "string", "obrien-fleming", "The alpha-spending function of a sequential design.",
      choices=("obrien-fleming", "pocock")),
    F("power.futility", "number", 0.0, "Non-binding: an arm whose probability of success at the last wave falls "
      "below this is futile; 0 = off.", lo=0, hi=1, open_hi=True),
    F("power.max_seeds", "integer", 10, "The most seeds per arm a recommendation (`advise`) may ask for.", lo=2,
      hi=1000),
    # -- [train] -------------------------------------------------------------------------------------
    F("train.model", "table", None, "A pretrained Hugging Face checkpoint (below).",
      shown_default="the built-in byte GPT-2"),
    F("train.data", "table", None, "Data files, JSONL or Parquet (below).", shown_default="the generated corpus",
      rule="required with `task.kind = \"single_turn\"`"),
    F("train.task", "table", None, "The task and its reward (below).", shown_default="retrieval QA, its verifier"),
    F("train.group_size", "integer", 4, "G rollouts sampled per prompt.", lo=2,
      why="a group of one has no relative signal"),
    F("train.clip_epsilon", "number", 0.2, "eps_c of the clipped ratio.", lo=0, hi=1, open_lo=True, open_hi=True),
    F("train.kl_coef", "number", 0.02, "beta of the KL term against the reference.", lo=0),
    F("train.reference_refresh_steps", "integer", 4, "The reference takes the policy's weights every K updates.",
      lo=1),
    F("train.advantage_eps", "number", 1e-6, "eps of A = (r - mean) / (std + eps).", lo=0),
    F("train.n_embd", "integer", 64, "Width of the built-in GPT-2.", lo=1,
      rule="divisible by `n_head`; not with `[train.model]`"),
    F("train.n_layer", "integer", 2, "Layers of the built-in GPT-2.", lo=1, rule="not with `[train.model]`"),
    F("train.n_head", "integer", 2, "Attention heads of the built-in GPT-2.", lo=1, rule="not with `[train.model]`"),
    F("train.n_positions", "integer", 512, "Context of the built-in GPT-2, in tokens.", lo=1,
      rule="at least 96 + max_turns x (max_new_tokens + retrieval_top_k x (passage_max_bytes + 2)); "
           "not with `[train.model]`"),
    F("train.prompts_per_step", "integer", 4, "Groups per step, over all ranks (split evenly).", lo=1),
    F("train.exposures_per_step", "integer", 2, "Exposure slots per step in exposure arms.", lo=0),
    F("train.max_new_tokens", "integer", 16, "Tokens per generation call (turn).", lo=1),
    F("train.max_turns", "integer", 2, "Generation calls per trajectory (search turns and the answer).", lo=1,
      rule="1 (its default there) with `task.kind = \"single_turn\"`"),
    F("train.temperature", "number", 1.0, "Sampling temperature of the rollouts.", lo=0, open_lo=True,
      why="ggpo needs sampled rollouts"),
    F("train.rollout", "string", "torch", "The rollout engine.", choices=("torch", "vllm")),
    F("train.vllm_gpu_memory_utilization", "number", 0.3, "Share of the GPU's memory vLLM takes.", lo=0, hi=1,
      open_lo=True),
    F("train.vllm_enforce_eager", 'true, false or "auto"', None, "vLLM's eager mode: \"auto\" is the device's "
      "choice (CUDA graphs on a GPU, eager on the CPU).", shown_default='`"auto"`', rule="`rollout = \"vllm\"` only"),
    F("train.tensor_parallel_size", "integer", 1, "Ranks per colocated vLLM engine; it must divide the "
      "training ranks.", choices=(1, 2, 4, 8), why="GPUs of one node", rule="more than 1: `rollout = \"vllm\"` only"),
    F("train.zero_stage", "integer", 2, "DeepSpeed ZeRO stage.", choices=(2, 3)),
    F("train.precision", "string", "auto", "bf16 on a GPU, fp32 on the CPU (auto).", choices=("auto", "fp32", "bf16"),
      rule="with `[train.model]`: `auto` (the model's `dtype` decides)"),
    F("train.lr", "number", 1e-3, "AdamW's learning rate.", lo=0, open_lo=True),
    F("train.micro_batch_size", "integer", 0, "Trajectories per forward/backward pass, gradients accumulated; "
      "0 = the rank's whole batch.", lo=0, rule="was `micro_batch_rows` (refused with the new name)"),
    F("train.max_tokens_per_pass", "integer", 0, "Padded tokens per forward/backward pass: each rank packs its rows, "
      "longest first, into as few passes as fit (each padded to its own longest row); 0 = what the memory "
      "estimate is checked at, rows per pass x max_model_len.", lo=0,
      rule="a row longer than it goes alone in a pass; `micro_batch_size` still bounds the rows of a pass"),
    F("train.logprob_chunk_tokens", "integer", 1024, "Masked tokens per log-prob chunk; 0 = full logits.", lo=0),
    F("train.logprob_chunk_vocab", "integer", 8192, "Vocabulary rows of the LM head per log-prob chunk.", lo=1),
    F("train.grad_clip", "number", 1.0, "Gradient norm clip.", lo=0),
    F("train.old_logprobs", "string", "policy", "PPO's \"old\" log-probs: the policy's before the update (verl; "
      "its own forward's in the update, detached: one optimizer step a batch), or the rollout engine's through a "
      "truncated importance weight (TRL); written into the run spec.", choices=("policy", "rollout")),
    F("train.rollout_is_cap", "number", 2.0, "Cap of the importance weight min(exp(policy - rollout), cap).",
      lo=1, hi=1e6, why="a cap below 1 would down-weight every token", rule="`old_logprobs = \"rollout\"` only"),
    F("train.aux_coef", "number", 1.0, "Weight of the auxiliary answer loss (`*_answer` arms).", lo=0),
    F("train.max_steps", "integer", 0, "Steps at most; 0 = no cap: the loop-time budget alone ends training.",
      lo=0),
    F("train.checkpoint_every", "integer", 0, "Steps between resumable checkpoints; 0 = only on SIGUSR1/SIGTERM.",
      lo=0),
    F("train.max_failed_probes", "integer", 3, "Consecutive failed weight-sync probes (a vLLM behaviour copy "
      "that did not take the pushed weights) that stop the run, `failed`, on every rank; a failed baseline "
      "stops it at once. Not written into the run spec at its default.", lo=1),
    F("train.synthetic_entities", "integer", 64, "Entities of the generated corpus.", lo=1),
    F("train.synthetic_eval_items", "integer", 24, "Held-out items of the generated corpus.", lo=1),
    F("train.synthetic_unsupported_fraction", "number", 0.3, "Share of generated questions no passage supports.",
      lo=0, hi=1, open_hi=True),
    F("train.retrieval_top_k", "integer", 2, "BM25 passages returned per search.", lo=1,
      rule="`task.kind = \"retrieval_qa\"` only"),
    F("train.passage_max_bytes", "integer", 64, "Each retrieved passage is cut to this many bytes.", lo=1,
      rule="`task.kind = \"retrieval_qa\"` only"),
    F("train.eval_size", "integer", 0, "Held-out items evaluated (the first N); 0 = all.", lo=0),
    F("train.eval_temperature", "number", 0.0, "0 = greedy evaluation; above 0, `eval_samples` sampled answers "
      "per item, rewards averaged.", lo=0),
    F("train.eval_samples", "integer", 1, "Sampled answers per evaluated item.", lo=1,
      rule="1 when `eval_temperature = 0`"),
    # -- [train.model] -------------------------------------------------------------------------------
    F("train.model.path", "string", REQUIRED, "A checkpoint directory (config.json, *.safetensors, tokenizer "
      "files with a chat template), or a hub id found only in the local Hugging Face cache; relative to the "
      "spec's folder.", rule="not empty"),
    F("train.model.dtype", "string", "bfloat16", "The training dtype (and the exported policy's).",
      choices=("bfloat16", "float16", "float32")),
    F("train.model.gradient_checkpointing", "boolean", False, "Recompute activations in the backward pass."),
    F("train.model.attn_implementation", "string", "sdpa", "The attention kernel.",
      choices=("sdpa", "eager", "flash_attention_2")),
    F("train.model.max_model_len", "integer", 4096, "Tokens of one trajectory: prompt, every turn, tool output.",
      lo=16, hi=1 << 20, shown_default="the model's own context, capped by the GPU-memory estimate (4096 in a "
      "run spec without it)"),
    F("train.model.chat_template_kwargs", "inline table", {}, "Keywords of the chat template, on every prompt "
      "(`{ enable_thinking = false }`).", rule="preflight refuses a thinking switch left at its default and a "
      "keyword the template never reads"),
    # -- [train.data] --------------------------------------------------------------------------------
    F("train.data.train", "string", REQUIRED, "Training items, JSONL (`.jsonl`) or Parquet (`.parquet`); "
      "relative to the spec's folder.", rule="not empty"),
    F("train.data.eval", "string", REQUIRED, "Held-out items, as `train`; exposure arms take theirs from here.",
      rule="not empty"),
    F("train.data.passages", "string", None, "Passages, JSONL or Parquet, indexed with BM25.",
      rule="not empty; required with `task.kind = \"retrieval_qa\"`, refused with `\"single_turn\"`",
      shown_default="required for retrieval QA"),
    F("train.data.columns", "inline table", {}, "The data files' column for each of the task's fields "
      "(`{ question = \"query\" }`); a dotted name reads a nested field (`reward_model.ground_truth`).",
      rule="retrieval QA: `id`, `question`, `answers`, `support_titles`; single turn: `id`, `prompt`, `answers`",
      shown_default="the field's own name (single turn: `answers`, else `answer`, else `reward_model.ground_truth`)"),
    # -- [train.task] --------------------------------------------------------------------------------
    F("train.task.kind", "string", "retrieval_qa", "Retrieval QA with the search tool over the passages, or one "
      "prompt and one completion (no tool).", choices=("retrieval_qa", "single_turn")),
    F("train.task.reward", "string or array of strings", "retrieval_qa", "The reward: a built-in (`retrieval_qa` "
      "the verifier: 1 if the gold answer is in the answer, else half the character F1; `exact_match`; "
      "`token_f1`; `math`, equivalence through math-verify) or `FILE.py:FUNCTION` relative to the spec's folder, "
      "called as TRL calls a reward function: `f(prompts, completions, **columns) -> list[float]`; several are "
      "summed with `reward_weights`.", max_items=8, rule="a user file is imported and called on two rows at enqueue"),
    F("train.task.reward_weights", "array of numbers", None, "One weight per reward.",
      shown_default="1 for each", rule="as many as rewards; each finite"),
    F("train.task.reward_timeout_seconds", "number", 30.0, "Time limit of one call of a user reward (the run "
      "fails past it), and of math-verify per answer (scored 0 past it).", lo=0, hi=3600, open_lo=True),
    # -- [[evaluations]] -----------------------------------------------------------------------------
    F("evaluations[].name", "string", REQUIRED, "Its outcome set (`report --outcomes NAME`).",
      rule=f"{limits.ARM_NAME_RULE}; not `training`; distinct"),
    F("evaluations[].data", "string", REQUIRED, "Items in `train.data.eval`'s format, JSONL; relative to the "
      "spec's folder; checked by preflight.", rule="one line"),
    F("evaluations[].gpus", "integer", 1, "GPUs of its own allocation, on one node.", lo=1, hi=64),
)

BY_KEY: dict[str, Field] = {f.key: f for f in FIELDS}
# The [train] fields every arm shares (an arm's override or a sweep of one is refused): arms are
# paired on the same items, scored the same way.
SAME_FOR_EVERY_ARM: tuple[str, ...] = ("train.data", "train.task", "train.synthetic_entities",
                                       "train.synthetic_eval_items", "train.synthetic_unsupported_fraction",
                                       "train.eval_size", "train.eval_temperature", "train.eval_samples")
SECTIONS: dict[str, str] = {  # the sections' titles on the reference page, in its order
    "": "The top level", "experiment": "`[experiment]`", "overheads": "`[overheads]`",
    "arms.<arm>": "`[arms.<arm>]`", "sweep": "`[sweep]`", "power": "`[power]`", "train": "`[train]`",
    "train.model": "`[train.model]`",
    "train.data": "`[train.data]`", "train.task": "`[train.task]`", "evaluations[]": "`[[evaluations]]`"}


def field(key: str) -> Field:
    """The field at `key` (KeyError: the table has no such key)."""
    return BY_KEY[key]


def fields_of(section: str) -> tuple[Field, ...]:
    """The fields of one table of the spec ("" the top level, "experiment", "arms.<arm>", "train.model"...)."""
    return tuple(f for f in FIELDS if f.section == section)


def keys(section: str) -> frozenset[str]:
    """The keys a table of the spec may hold."""
    return frozenset(f.name for f in fields_of(section))


def default(key: str) -> Any:
    """The default of `key` (what a dataclass of the parser declares): a fresh copy of a list or table."""
    value = BY_KEY[key].default
    return type(value)(value) if isinstance(value, (list, dict)) else value


def most(key: str) -> int:
    """The upper bound of an integer field, or the entries an array or table of tables may hold."""
    f = BY_KEY[key]
    most = f.max_items if f.max_items is not None else f.hi
    if most is None:
        raise KeyError(f"{key} has no upper bound")
    return int(most)


_GENERATED = ("<!-- Generated from {source} by `python tools/docs/reference.py`; tests/test_docs.py fails "
              "when it is stale. -->")
_INTRO = ("Every key an experiment spec (`jobs/*.toml`, TOML) may hold: its type, its default when left out, its "
          "limit and what it means. A key not listed is refused (exit 2, one line naming the file and the field), "
          "and so is a value out of its limit. Relative paths are taken from the spec's folder. "
          "[The researcher's guide](../researcher.md#writing-a-spec) shows a whole spec.")


def markdown() -> str:
    """The reference page of every spec field (docs/reference/spec.md)."""
    lines = ["# Spec reference", "", _GENERATED.format(source="ggpo_batch/contracts/spec_fields.py"), "", _INTRO, ""]
    for section, title in SECTIONS.items():
        lines += [f"## {title}", "", "| key | type | default | limit | meaning |", "| --- | --- | --- | --- | --- |"]
        for f in fields_of(section):
            lines.append(f"| `{f.name}` | {f.type} | {f.default_text()} | {f.limit_text()} | {f.meaning} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ggpo_batch.contracts.spec_fields", description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", action="store_true", help="Print the reference page (docs/reference/spec.md).")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(), end="")
    else:
        for f in FIELDS:
            print(f"{f.key:42} {f.default_text():20} {f.limit_text()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
