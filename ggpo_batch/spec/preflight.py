"""Preflight: everything a spec needs from the world that can be known without a GPU, checked before
anything is queued (`enqueue`, `enqueue --dry-run`, `train`).

`spec.py` checks the spec's own shape; this module checks what it names: the installed libraries
(`versions.py`: one older than the code needs), the model directory (config, causal-LM architecture,
safetensors weights), its tokenizer (loads, has a chat template and EOS; the vocabulary against the
embeddings, the template's thinking switch, keywords and date: train/model_check.py), the `[train.data]` files (parse, hold enough held-out
items for every arm's exposures, train and held-out ids apart), the prompts against `max_model_len`,
the ranks against the step's groups and the templates against the group size, the precision against
the executor, and the profile's GPUs against the model (the estimate below). Every problem is
collected, one line each naming the field; a problem that is only "this file or directory is absent
from this machine" is marked as such (`Problem.absent`), so a spec written for a cluster can be told
apart from a wrong one.

The GPU-memory estimate is `gpu_memory.memory_estimate` (its formula is documented there).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import GgpoError, SpecError
from ..train.policy.gpu_memory import GIB, memory_parts
from ..train.policy.passes import pass_tokens, rows_per_pass
from .arm_checks import arm_groups, merge_arm_problems
from .prompt_fit import prompts_fit
from .sizing import allocation

if TYPE_CHECKING:
    from ..contracts.runspec import ArmSpec
    from ..train.config import TrainConfig
    from ..train.task.qa import Item
    from .experiment import ExperimentSpec

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
    caller decides them, as `train --nproc` does, instead of the executor's). Each arm is checked
    with its own train (spec/arm_checks.py): a problem only an arm's overrides cause names the arm."""
    from ..train.config import TrainConfig

    report = Report(spec.path)
    chosen = [spec.arm(a) for a in arms] if arms else list(spec.arms)
    executor_ranks, gpu_bytes = _allocation(spec, report, profiles_dir)
    ranks = ranks or executor_ranks
    data: _Data | None = None
    memo: dict[Any, Any] = {}  # models and prompt lengths, measured once for the arms that share them
    for i, (train, group) in enumerate(arm_groups(spec, chosen)):
        own = train == dict(spec.train)
        sub = report if own else Report(spec.path)
        cfg = TrainConfig.from_table(train, spec.path)
        if i == 0:  # the data and the task are the same for every arm (an arm may not override them)
            data = _data(spec, cfg, report)
            if data is not None:
                _rewards(spec, cfg, data, report)
        _train_checks(spec, cfg, group, data, ranks, gpu_bytes, sub, memo)
        if not own:
            merge_arm_problems(report, sub, [a.name for a in group])
            if i == 0:  # no arm checked trains with the spec's own table: the figures are the first arm's
                report.facts.update({k: v for k, v in sub.facts.items() if k not in report.facts})
    _evaluations(spec, report)
    for p in report.problems:
        log.info("preflight: %s: %s", p.field, p.message)
    return report


def _train_checks(spec: ExperimentSpec, cfg: TrainConfig, arms: list[ArmSpec], data: _Data | None, ranks: int,
                  gpu_bytes: float | None, report: Report, memo: dict[Any, Any]) -> None:
    """What depends on a train: the libraries, the ranks against the step, the arms against the
    data, the model, the prompts against max_model_len, the precision and the GPU memory."""
    _versions(cfg, report)
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
    if data is not None:
        _arms(cfg, arms, data, report)
    key = ("model", repr(cfg.model) if cfg.model is not None else repr((cfg.n_embd, cfg.n_layer, cfg.n_positions)))
    if key not in memo:
        memo[key] = _model(cfg, report)
    model = memo[key]
    if model is not None and data is not None:
        prompts_fit(cfg, arms, data, model["codec"], report, memo, key)
    if cfg.model is not None:
        _precision(spec, cfg, report)
    if model is not None and gpu_bytes is not None:
        _memory(spec, cfg, model, ranks, gpu_bytes, report)


def _versions(cfg: TrainConfig, report: Report) -> None:
    """The submit host's libraries against what the code needs (versions.py): one installed older is
    refused; one not installed is allowed (a submit host needs only the base install), the
    allocation's own check at the job's start refuses it there."""
    from ..train import versions

    for package, line in versions.problems(versions.needed(cfg), installed_only=True):
        report.add(package, f"on this machine, {line}")


# -- the allocation ---------------------------------------------------------------------------------


def _allocation(spec: ExperimentSpec, report: Report, profiles_dir: Path | None) -> tuple[int, float | None]:
    """(training ranks, bytes of one GPU or None when unknown or no GPU) for the spec's executor."""
    ranks, gpu_bytes, problems = allocation(spec, profiles_dir)
    for field_, message in problems:
        report.add(field_, message)
    return ranks, gpu_bytes


# -- data and arms ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Data:
    train: tuple[Item, ...]
    heldout: tuple[Item, ...]
    source: str


def _data(spec: ExperimentSpec, cfg: TrainConfig, report: Report) -> _Data | None:
    from ..train.task import qa as task

    if cfg.data is None:
        d = task.synthetic(cfg)
        return _Data(d.train, d.heldout, f"the generated corpus (train.synthetic_eval_items = "
                                         f"{cfg.synthetic_eval_items}; no [train.data])")
    found: dict[str, Any] = {}
    reads = [("train", task.read_items), ("eval", task.read_items)]
    if cfg.data.passages is not None:
        reads.append(("passages", task.read_passages))
    for key, read in reads:
        extra = {"kind": cfg.kind, "columns": cfg.data.columns} if read is task.read_items else {}
        try:
            found[key] = read(getattr(cfg.data, key), f"train.data.{key}", spec.path, **extra)
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
    from ..train.task.qa import support_coverage

    cov = support_coverage(items, passages)
    if cov.items_with_titles and not cov.titles_found:
        report.add("train.data.passages", f"holds none of the support titles its {cov.items_with_titles} items "
                   f"name: are these the passages of train.data.train and train.data.eval?")
    elif cov.items_missing:
        report.facts["support_titles_missing"] = {"items": cov.items_missing, "of": cov.items_with_titles,
                                                  "share": round(cov.share_missing, 4)}
        log.warning("preflight: train.data.passages: %s", cov.message())


def _rewards(spec: ExperimentSpec, cfg: TrainConfig, data: _Data, report: Report) -> None:
    """The rewards the run will call: math-verify installed for `math`; each user file imported and called
    on two rows in a child process under a time limit (train/task/reward_check.py)."""
    from ..train.task.reward_check import check_user_reward

    if cfg.task is None:
        return
    if "math" in cfg.task.rewards:
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:
            report.add("train.task.reward", "\"math\" needs the math-verify library on this machine (pip install "
                       "'ggpo-batch[train]')")
    rows = (data.train or data.heldout)[:2]
    for file, function in cfg.task.user_files:
        problem = check_user_reward(file, function, rows, seconds=cfg.task.reward_timeout_seconds)
        if problem is not None:
            report.add("train.task.reward", f"{file}:{function}: {problem}", absent=problem.startswith("is absent"))


def _evaluations(spec: ExperimentSpec, report: Report) -> None:
    """The data files of [[evaluations]] (checked as train.data's eval file) and their GPUs against the
    executor: what settlement will queue once each run succeeds."""
    from ..train.task.qa import DataFileError
    from .evaluation_requests import check_data, check_gpus

    run_spec = {"executor": spec.executor, "profile": spec.profile, "train": dict(spec.train)}
    for i, r in enumerate(spec.evaluations):
        try:
            check_data(r.data, spec.path, f"evaluations[{i}].data", dict(spec.train))
        except DataFileError as exc:
            report.add(exc.field, exc.problem, absent=exc.absent)
        try:
            check_gpus(run_spec, r.gpus, spec.path, f"evaluations[{i}].gpus")
        except SpecError as exc:
            report.add(exc.field, exc.problem)


def _arms(cfg: TrainConfig, arms: list[ArmSpec], data: _Data, report: Report) -> None:
    from ..train.task.qa import TEMPLATES

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
        from ..train.task.codec import ByteCodec
        from ..train.task.tokenizer import VOCAB_SIZE

        h, layers = cfg.n_embd, cfg.n_layer
        params = layers * 12 * h * h + (VOCAB_SIZE + cfg.n_positions) * h
        return {"codec": ByteCodec(cfg.n_positions), "parameters": params, "hidden": h, "layers": layers,
                "vocab": VOCAB_SIZE, "dtype_bytes": 4}
    from ..train.task import model_check

    return model_check.check(cfg, report)


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
