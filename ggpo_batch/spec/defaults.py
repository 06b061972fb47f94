"""Defaults a spec takes from the model it names, resolved where the spec is (`spec.parse_spec`), so
the run specs and their hashes carry the number a run will use, and `enqueue --dry-run` says where
it came from.

`[train.model] max_model_len`, when the spec leaves it out: the model's own context
(`max_position_embeddings`, or `n_positions`), capped by the GPU-memory formula
(ggpo_batch/train/policy/gpu_memory.py) when the spec's profile declares its GPUs' memory: the longest length,
a multiple of 64, at which the estimate fits. A model that is not on this machine (or that preflight
will refuse) leaves the spec as it is: preflight says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .experiment import ExperimentSpec

ROUND_TO = 64  # a length capped by memory is rounded down to a multiple of this


def apply(spec: ExperimentSpec, profiles_dir: Path | None = None) -> ExperimentSpec:
    """`spec` with the defaults it takes from its model filled in (and said in `spec.defaults`): its
    `[train]`'s, then each arm's whose own train (another model, another batch) takes another."""
    base = _filled(spec, spec.train, profiles_dir)
    out = spec
    if base is not None:
        value, why = base
        out = dataclasses.replace(spec, train={**spec.train, "model": {**spec.train["model"], "max_model_len": value}},
                                  defaults=(*spec.defaults, f"train.model.max_model_len = {value:,} ({why})"))
    arm_train = dict(out.arm_train)
    lines = []
    for arm, overrides in spec.arm_train.items():
        found = _filled(spec, spec.train_of(arm), profiles_dir)
        if found is None or (base is not None and found[0] == base[0]):
            continue
        arm_train[arm] = {**overrides, "model": {**overrides.get("model", {}), "max_model_len": found[0]}}
        lines.append(f"arms.{arm}.train.model.max_model_len = {found[0]:,} ({found[1]})")
    if lines:
        out = dataclasses.replace(out, arm_train=arm_train, defaults=(*out.defaults, *lines))
    return out


def _filled(spec: ExperimentSpec, train: Mapping[str, Any], profiles_dir: Path | None) -> tuple[int, str] | None:
    """(max_model_len, why) for a train whose [train.model] leaves it out; None otherwise."""
    model = train.get("model")
    if not isinstance(model, Mapping) or "max_model_len" in model:
        return None
    return default_max_model_len(dataclasses.replace(spec, train=train), profiles_dir)


def default_max_model_len(spec: ExperimentSpec, profiles_dir: Path | None = None) -> tuple[int, str] | None:
    """(tokens, where they come from) for a spec whose `[train.model]` has no max_model_len; None when
    the model cannot be read here."""
    from ..train.config import MAX_MODEL_LEN_RANGE
    from ..train.pretrained import checkpoint_files, hf

    try:
        folder = hf.resolve(spec.train["model"]["path"])
    except hf.CheckpointError:
        return None
    if checkpoint_files.folder_problems(folder):
        return None
    try:
        config = checkpoint_files.read_json(folder / "config.json")
    except checkpoint_files.CheckpointFileError:
        return None
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    positions = _first_int((config, text), ("max_position_embeddings", "n_positions"))
    lo, hi = MAX_MODEL_LEN_RANGE
    if positions is None or positions < lo:
        return None
    value, why = min(positions, hi), "the model's max_position_embeddings"
    fit = _memory_fit(spec, folder, config, text, lo, value, profiles_dir)
    if fit is not None and fit[0] < value:
        value, why = fit[0], f"the model's {positions:,} positions, capped by the GPU memory estimate: {fit[1]}"
    return value, why


def _first_int(tables: tuple[Mapping[str, Any], ...], keys: tuple[str, ...]) -> int | None:
    for table in tables:
        for key in keys:
            v = table.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _memory_fit(spec: ExperimentSpec, folder: Path, config: Mapping[str, Any], text: Mapping[str, Any], lo: int,
                hi: int, profiles_dir: Path | None) -> tuple[int, str] | None:
    """(the longest length in lo..hi whose estimate fits the profile's GPU, how) or None: no GPU size
    known, or not even `lo` fits (preflight then says the model does not fit)."""
    from ..train.config import TrainConfig
    from ..train.policy.gpu_memory import GIB, memory_parts
    from ..train.policy.passes import rows_per_pass
    from ..train.pretrained import checkpoint_files, hf
    from .sizing import allocation

    ranks, gpu_bytes, _ = allocation(spec, profiles_dir)  # its problems are the preflight's to report
    if gpu_bytes is None:
        return None
    cfg = TrainConfig.from_table(spec.train, spec.path)
    assert cfg.model is not None
    try:
        parameters = checkpoint_files.parameters(checkpoint_files.weight_files(folder), checkpoint_files.roots(folder))
    except checkpoint_files.CheckpointFileError:
        return None
    rows = rows_per_pass(cfg, ranks)
    shape = {"parameters": parameters, "dtype_bytes": hf.DTYPE_BYTES[cfg.model.dtype],
             "hidden": _first_int((text, config), ("hidden_size", "n_embd")) or 0,
             "layers": _first_int((text, config), ("num_hidden_layers", "n_layer")) or 0,
             "vocab": _first_int((config, text), ("vocab_size",)) or 0}

    def total(seq_len: int) -> float:
        return memory_parts(cfg, shape, ranks, gpu_bytes, seq_len)["total"]

    if total(hi) <= gpu_bytes:
        return hi, "it fits"
    if total(lo) > gpu_bytes:
        return None
    good, bad = lo, hi  # total(good) fits, total(bad) does not: the estimate grows with the length
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if total(mid) <= gpu_bytes else (good, mid)
    value = max(lo, good - good % ROUND_TO) if good >= ROUND_TO else good
    return value, (f"~{total(value) / GIB:.1f} GiB of profile {spec.profile!r}'s {gpu_bytes / GIB:g} GiB GPUs at "
                   f"{rows} rows per pass")
