"""Preflight: everything a spec needs from the world that can be known without a GPU, checked before
anything is queued (`enqueue`, `enqueue --dry-run`, `train`).

`spec.py` checks the spec's own shape; this module checks what it names: the installed libraries
(`versions.py`: one older than the code needs), the model directory (config, causal-LM architecture,
safetensors weights), its tokenizer (loads, has a chat template and EOS; the template's thinking
switch and keywords, train/chat_template.py), the `[train.data]` files (parse, hold enough held-out
items for every arm's exposures, train and held-out ids apart), the prompts against `max_model_len`,
the ranks against the step's groups and the templates against the group size, the precision against
the executor, and the profile's GPUs against the model (the estimate below). Every problem is
collected, one line each naming the field; a problem that is only "this file or directory is absent
from this machine" is marked as such (`Problem.absent`), so a spec written for a cluster can be told
apart from a wrong one.

The GPU-memory estimate is `gpu_memory.memory_estimate` (its formula is documented there).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import GgpoError, SpecError
from .gpu_memory import GIB, memory_estimate
from .train.passes import pass_tokens, rows_per_pass

if TYPE_CHECKING:
    from .runspec import ArmSpec
    from .spec import ExperimentSpec
    from .train.codec import Codec
    from .train.config import TrainConfig
    from .train.task import Item

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Problem:
    """One thing that would fail on the allocation: the spec field to change and why."""

    field: str
    message: str
    absent: bool = False  # only that a file or directory the spec names is not on this machine


@dataclass
class Report:
    """What preflight checked: its problems, and the figures it measured (for --dry-run)."""

    path: str
    problems: list[Problem] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, field_: str, message: str, *, absent: bool = False) -> None:
        self.problems.append(Problem(field_, message, absent))

    def lines(self) -> list[str]:
        """One line per problem: `file: field: what is wrong`."""
        return [f"{self.path}: {p.field}: {p.message}" for p in self.problems]


class PreflightError(GgpoError):
    """A spec that would fail on its allocation: every problem, one line each (exit 2)."""

    def __init__(self, report: Report) -> None:
        self.report = report
        self.lines = report.lines()
        super().__init__("; ".join(self.lines))


def require(spec: ExperimentSpec, *, arms: list[str] | None = None, ranks: int | None = None) -> Report:
    """`check(spec)`, raising PreflightError when anything would fail."""
    report = check(spec, arms=arms, ranks=ranks)
    if not report.ok:
        raise PreflightError(report)
    return report


def check(spec: ExperimentSpec, *, arms: list[str] | None = None, profiles_dir: Path | None = None,
          ranks: int | None = None) -> Report:
    """Every problem preflight finds in `spec` (only the named `arms` when given; `ranks` when the
    caller decides them, as `train --nproc` does, instead of the executor's)."""
    from .train.config import TrainConfig

    report = Report(spec.path)
    cfg = TrainConfig.from_table(spec.train, spec.path)
    _versions(cfg, report)
    chosen = [spec.arm(a) for a in arms] if arms else list(spec.arms)
    executor_ranks, gpu_bytes = _allocation(spec, report, profiles_dir)
    ranks = ranks or executor_ranks
    if cfg.model is not None and spec.executor == "slurm" and gpu_bytes is None \
            and not any(p.field == "experiment.profile" for p in report.problems):
        report.add("experiment.profile", f"profile {spec.profile!r} does not declare gpu_memory_gib (one GPU's memory): "
                   f"preflight cannot check that the model fits")
    if cfg.prompts_per_step % ranks:
        report.add("train.prompts_per_step", f"{cfg.prompts_per_step} groups per step do not split over the "
                   f"{ranks} training ranks of executor {spec.executor!r}; use a multiple of {ranks}")
    # A vLLM engine spans tensor_parallel_size ranks of one node (vllm_backend.check_tensor_parallel
    # refuses it again in the job, where the world is known for sure).
    per_node = ranks // spec.nodes if ranks % spec.nodes == 0 else ranks
    if cfg.tensor_parallel_size > 1 and per_node % cfg.tensor_parallel_size:
        report.add("train.tensor_parallel_size", f"{cfg.tensor_parallel_size} does not divide the {per_node} training "
                   f"ranks of a node (executor {spec.executor!r}); each vLLM engine spans that many ranks of one node")
    data = _data(spec, cfg, report)
    if data is not None:
        _arms(cfg, chosen, data, report)
    _evaluations(spec, report)
    model = _model(cfg, report)
    if model is not None and data is not None:
        _prompts_fit(cfg, chosen, data, model["codec"], report)
    if cfg.model is not None:
        _precision(spec, cfg, report)
    if model is not None and gpu_bytes is not None:
        _memory(spec, cfg, model, ranks, gpu_bytes, report)
    for p in report.problems:
        log.info("preflight: %s: %s", p.field, p.message)
    return report


def _versions(cfg: TrainConfig, report: Report) -> None:
    """The submit host's libraries against what the code needs (versions.py): one installed older is
    refused; one not installed is allowed (a submit host needs only the base install), the
    allocation's own check at the job's start refuses it there."""
    from . import versions

    for package, line in versions.problems(versions.needed(cfg), installed_only=True):
        report.add(package, f"on this machine, {line}")


# -- the allocation ---------------------------------------------------------------------------------


def allocation(spec: ExperimentSpec, profiles_dir: Path | None = None) -> tuple[int, float | None]:
    """(training ranks, bytes of one GPU or None) of the spec's executor and profile; problems are `check`'s."""
    return _allocation(spec, Report(spec.path), profiles_dir)


def _allocation(spec: ExperimentSpec, report: Report, profiles_dir: Path | None) -> tuple[int, float | None]:
    """(training ranks, bytes of one GPU or None when unknown or no GPU) for the spec's executor."""
    if spec.executor == "debug":
        return 1, None
    if spec.executor == "local":  # CPU ranks on the worker's machine, as many as make_executor gives it
        from .executor import make_executor

        return int(inspect.signature(make_executor).parameters["local_tasks"].default), None
    from .executor.profile import load_profile

    try:
        profile = load_profile(spec.profile, profiles_dir)  # None: the profile search path (datafiles.py)
    except SpecError as exc:
        report.add("experiment.profile", exc.message)
        return spec.gpus, None
    if spec.gpus != profile.gpus_per_node:
        report.add("experiment.gpus", f"{spec.gpus} GPUs, but profile {profile.name!r} allocates "
                   f"{profile.gpus_per_node} per run (gpus_per_node)")
    if spec.nodes != profile.nodes:
        report.add("experiment.nodes", f"{spec.nodes} nodes, but profile {profile.name!r} allocates "
                   f"{profile.nodes} per run (nodes)")
    gib = getattr(profile, "gpu_memory_gib", None)
    return profile.tasks_per_node * profile.nodes, (gib * GIB if gib else None)


# -- data and arms ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Data:
    train: tuple[Item, ...]
    heldout: tuple[Item, ...]
    source: str


def _data(spec: ExperimentSpec, cfg: TrainConfig, report: Report) -> _Data | None:
    from .train import task

    if cfg.data is None:
        d = task.synthetic(cfg)
        return _Data(d.train, d.heldout, f"the generated corpus (train.synthetic_eval_items = "
                                         f"{cfg.synthetic_eval_items}; no [train.data])")
    found: dict[str, Any] = {}
    for key, read in (("train", task.read_items), ("eval", task.read_items), ("passages", task.read_passages)):
        try:
            found[key] = read(getattr(cfg.data, key), f"train.data.{key}", spec.path)
        except task.DataFileError as exc:
            report.add(exc.field, exc.problem, absent=exc.absent)
    if "train" in found and "eval" in found:
        overlap = sorted({i.item_id for i in found["train"]} & {i.item_id for i in found["eval"]})
        if overlap:
            report.add("train.data.eval", f"{len(overlap)} id(s) are also in train.data.train ({overlap[0]!r}, ...): "
                       f"held-out items must be held out")
    if "passages" in found:
        _support(found.get("train", ()) + found.get("eval", ()), found["passages"], report)
    if "eval" not in found:
        return None
    report.facts.update(train_items=len(found.get("train", ())), eval_items=len(found["eval"]),
                        passages=len(found.get("passages", ())))
    return _Data(found.get("train", ()), found["eval"], f"train.data.eval ({cfg.data.eval})")


def _support(items: tuple[Item, ...], passages: Any, report: Report) -> None:
    """Support titles the passages file does not hold: counted and warned (some questions may be
    unsupported on purpose); refused when none of them is there (the passages of other items)."""
    from .train.task import support_coverage

    cov = support_coverage(items, passages)
    if cov.items_with_titles and not cov.titles_found:
        report.add("train.data.passages", f"holds none of the support titles its {cov.items_with_titles} items "
                   f"name: are these the passages of train.data.train and train.data.eval?")
    elif cov.items_missing:
        report.facts["support_titles_missing"] = {"items": cov.items_missing, "of": cov.items_with_titles,
                                                  "share": round(cov.share_missing, 4)}
        log.warning("preflight: train.data.passages: %s", cov.message())


def _evaluations(spec: ExperimentSpec, report: Report) -> None:
    """The data files of [[evaluations]] (checked as train.data's eval file) and their GPUs against the
    executor: what settlement will queue once each run succeeds."""
    from .evaluation_spec import check_data, check_gpus
    from .train.task import DataFileError

    run_spec = {"executor": spec.executor, "profile": spec.profile, "train": dict(spec.train)}
    for i, r in enumerate(spec.evaluations):
        try:
            check_data(r.data, spec.path, f"evaluations[{i}].data")
        except DataFileError as exc:
            report.add(exc.field, exc.problem, absent=exc.absent)
        try:
            check_gpus(run_spec, r.gpus, spec.path, f"evaluations[{i}].gpus")
        except SpecError as exc:
            report.add(exc.field, exc.problem)


def _arms(cfg: TrainConfig, arms: list[ArmSpec], data: _Data, report: Report) -> None:
    from .train.task import TEMPLATES

    n = len(data.heldout)
    for arm in arms:
        if arm.exposure == "none":
            continue
        where = f"arms.{arm.name}"
        unknown = [t for t in arm.templates if t not in TEMPLATES]
        if unknown:
            report.add(f"{where}.templates", f"unknown template(s) {', '.join(map(repr, unknown))} (known: "
                       f"{', '.join(sorted(TEMPLATES))})")
        if not 0 < arm.exposed_items <= n:
            report.add(f"{where}.exposed_items", f"must be in 1..{n} (held-out items of {data.source}), "
                       f"got {arm.exposed_items}")
        if arm.exposure == "paired" and cfg.group_size % max(1, len(arm.templates)):
            report.add("train.group_size", f"{cfg.group_size} does not split over the {len(arm.templates)} "
                       f"templates of arm {arm.name!r}'s shared groups")


# -- the model ----------------------------------------------------------------------------------------


def _model(cfg: TrainConfig, report: Report) -> dict[str, Any] | None:
    """The checkpoint's figures and codec (the built-in model's without [train.model]), or None."""
    if cfg.model is None:
        from .train.codec import ByteCodec
        from .train.tokenizer import VOCAB_SIZE

        h, layers = cfg.n_embd, cfg.n_layer
        params = layers * 12 * h * h + (VOCAB_SIZE + cfg.n_positions) * h
        return {"codec": ByteCodec(cfg.n_positions), "parameters": params, "hidden": h, "layers": layers,
                "vocab": VOCAB_SIZE, "dtype_bytes": 4}
    from .train import hf

    where = "train.model.path"
    try:
        folder = hf.resolve(cfg.model.path)
    except hf.CheckpointError as exc:
        report.add(where, exc.message, absent=exc.absent)
        return None
    untrusted = hf.check_folder(folder)  # before any library reads it (links out, FIFOs, bad JSON, headers)
    for problem in untrusted:
        report.add(where, problem)
    if untrusted:
        return None
    try:
        config = hf.load_config(folder)
    except Exception as exc:  # noqa: BLE001  (transformers raises OSError, ValueError, KeyError...)
        report.add(where, f"{folder}: the config does not load: {_first_line(exc)}")
        return None
    ok = True
    if not hf.is_causal_lm(config):
        report.add(where, f"{folder}: model_type {getattr(config, 'model_type', None)!r} is not a causal LM that "
                   f"AutoModelForCausalLM loads")
        ok = False
    try:
        files = hf.weight_files(folder)
        eos = hf.eos_ids(folder)
    except hf.CheckpointError as exc:  # changed since it was checked
        report.add(where, exc.message)
        return None
    missing = [f.name for f in files if not f.is_file()]
    if not files or missing:
        report.add(where, f"{folder}: no safetensors weights" + (f" ({', '.join(missing[:3])} absent)" if missing else ""))
        ok = False
    try:
        tokenizer = hf.load_tokenizer(folder)
    except Exception as exc:  # noqa: BLE001
        report.add(where, f"{folder}: the tokenizer does not load: {_first_line(exc)}")
        return None
    if not getattr(tokenizer, "chat_template", None):
        report.add(where, f"{folder}: the tokenizer has no chat template (prompts are built with it)")
        ok = False
    if tokenizer.eos_token_id is None and not eos:
        report.add(where, f"{folder}: neither the tokenizer nor generation_config.json names an EOS token")
        ok = False
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab and len(tokenizer) > vocab:
        report.add(where, f"{folder}: the tokenizer has {len(tokenizer)} tokens, the model's embeddings {vocab}")
        ok = False
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions and cfg.model.max_model_len > positions:
        report.add("train.model.max_model_len", f"{cfg.model.max_model_len} is more than the model's "
                   f"{positions} positions (max_position_embeddings)")
    if not ok:
        return None
    from .train import chat_template
    from .train.codec import HfCodec

    codec = HfCodec(tokenizer, max_model_len=cfg.model.max_model_len, eos_ids=eos,
                    chat_template_kwargs=cfg.model.chat_template_kwargs)
    # The template's thinking switch, its keywords, and the prompt it renders (train/chat_template.py).
    template = chat_template.check(tokenizer.get_chat_template(), cfg.model.chat_template_kwargs,
                                   lambda q: codec.chat_text(codec.user_message(q)))
    for problem in template.problems:
        report.add(chat_template.FIELD, f"{folder}: {problem}")
    if not template.renders:
        return None
    try:
        params = hf.safetensors_parameters(files)
    except hf.CheckpointError as exc:
        report.add(where, exc.message)
        return None
    text = getattr(config, "text_config", None) or config
    info = {"codec": codec, "parameters": params, "hidden": int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0)),
            "layers": int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0)),
            "vocab": vocab or len(tokenizer), "dtype_bytes": hf.DTYPE_BYTES[cfg.model.dtype]}
    report.facts.update(model_dir=str(folder), parameters=params, model_type=config.model_type)
    return info


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _prompts_fit(cfg: TrainConfig, arms: list[ArmSpec], data: _Data, codec: Codec, report: Report) -> None:
    """The longest prompt of every (item, template) the runs can draw, plus a full episode, fits
    max_model_len."""
    from .train.codec import HfCodec

    pairs = [(it, "train") for it in data.train] + [(it, "eval") for it in data.heldout]
    for t in sorted({t for a in arms for t in a.templates}):
        pairs += [(it, t) for it in data.heldout]
    pairs = [(it, t) for it, t in pairs if t in _known_templates()]
    if not pairs:
        return
    lengths = _prompt_lengths(codec, pairs)
    longest = max(range(len(pairs)), key=lengths.__getitem__)
    prompt = lengths[longest]
    if isinstance(codec, HfCodec):
        tool = codec.tool_output_bound(cfg.retrieval_top_k, cfg.passage_max_bytes)
    else:
        tool = cfg.retrieval_top_k * (cfg.passage_max_bytes + 2)
    need = prompt + cfg.max_turns * cfg.max_new_tokens + (cfg.max_turns - 1) * tool
    limit = cfg.max_model_len
    field_ = "train.model.max_model_len" if cfg.model is not None else "train.n_positions"
    item, template = pairs[longest]
    report.facts.update(longest_prompt_tokens=prompt, episode_tokens_at_most=need, max_model_len=limit)
    if need > limit:
        report.add(field_, f"{limit} tokens cannot hold the longest prompt ({prompt} tokens: item "
                   f"{item.item_id!r}, template {template!r}) + max_turns x max_new_tokens ({cfg.max_turns} x "
                   f"{cfg.max_new_tokens}) + tool output ({cfg.max_turns - 1} x at most {tool} tokens) = {need}")


def _known_templates() -> set[str]:
    from .train.task import TEMPLATES

    return set(TEMPLATES)


def _prompt_lengths(codec: Codec, pairs: list[tuple[Item, str]]) -> list[int]:
    """Prompt tokens of each (item, template), as the codec builds them (chat template rendered
    once per distinct text, tokenized in one batch)."""
    from .train.codec import HfCodec
    from .train.task import render

    if not isinstance(codec, HfCodec):
        return [len(codec.prompt(t, it)) for it, t in pairs]
    contents = [codec.user_message(render(t, it)) for it, t in pairs]
    # The chat template around one user message is the same for every message: render it once around
    # a marker and splice; checked against a full rendering of the first prompt.
    marker = "\x00GGPO-CONTENT\x00"
    shell = codec.chat_text(marker)
    texts = None
    if shell.count(marker) == 1:
        head, tail = shell.split(marker)
        texts = [head + c + tail for c in contents]
        if texts[0] != codec.chat_text(contents[0]):
            texts = None
    if texts is None:
        texts = [codec.chat_text(c) for c in contents]
    return [len(ids) for ids in codec.tokenizer(texts, add_special_tokens=False)["input_ids"]]


# -- precision, memory ----------------------------------------------------------------------------------


def _precision(spec: ExperimentSpec, cfg: TrainConfig, report: Report) -> None:
    assert cfg.model is not None
    if spec.executor in ("local", "debug"):
        if cfg.model.dtype == "float16":
            report.add("train.model.dtype", f"float16 (loss scaling) needs a GPU; executor {spec.executor!r} trains on "
                       f"the CPU: use float32 or bfloat16")
        if cfg.model.attn_implementation == "flash_attention_2":
            report.add("train.model.attn_implementation", f"flash_attention_2 needs a GPU; executor {spec.executor!r} "
                       f"trains on the CPU: use sdpa or eager")


def memory_parts(cfg: TrainConfig, model: Mapping[str, Any], ranks: int, gpu_bytes: float,
                 seq_len: int | None = None) -> dict[str, float]:
    """gpu_memory.memory_estimate of `cfg` on a model of shape `model` (parameters, dtype_bytes,
    hidden, layers, vocab) at `seq_len` tokens (default: the config's max_model_len)."""
    return memory_estimate(
        parameters=model["parameters"], dtype_bytes=model["dtype_bytes"], ranks=ranks, zero_stage=cfg.zero_stage,
        rows=rows_per_pass(cfg, ranks), seq_len=seq_len or cfg.max_model_len,
        tokens=pass_tokens(cfg, ranks, seq_len), hidden=model["hidden"],
        layers=model["layers"], vocab=model["vocab"],
        gradient_checkpointing=bool(cfg.model and cfg.model.gradient_checkpointing), rollout=cfg.rollout,
        vllm_fraction=cfg.vllm_gpu_memory_utilization, gpu_bytes=gpu_bytes, chunk_tokens=cfg.logprob_chunk_tokens,
        chunk_vocab=cfg.logprob_chunk_vocab, tensor_parallel_size=cfg.tensor_parallel_size)


def _memory(spec: ExperimentSpec, cfg: TrainConfig, model: dict[str, Any], ranks: int, gpu_bytes: float,
            report: Report) -> None:
    rows = rows_per_pass(cfg, ranks)
    parts = memory_parts(cfg, model, ranks, gpu_bytes)
    report.facts["gpu_memory_estimate_gib"] = {k: round(v / GIB, 2) for k, v in parts.items()}
    report.facts["gpu_memory_gib"] = gpu_bytes / GIB
    if parts["total"] > gpu_bytes:
        shown = ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items() if k != "total")
        report.add("experiment.profile", f"the model does not fit: ~{parts['total'] / GIB:.1f} GiB per GPU needed "
                   f"({shown}; {model['parameters']:,} parameters x {model['dtype_bytes']} bytes, ZeRO-"
                   f"{cfg.zero_stage} over {ranks} GPUs, {rows} rows x {cfg.max_model_len} tokens per pass, at most "
                   f"{pass_tokens(cfg, ranks)} tokens), profile {spec.profile!r} has {gpu_bytes / GIB:g} GiB GPUs; "
                   f"lower train.micro_batch_size, max_tokens_per_pass or max_model_len, turn on "
                   f"gradient_checkpointing, use zero_stage 3, or a larger GPU")
