"""A pretrained Hugging Face checkpoint, offline: where it is, its config and tokenizer, its size,
the policy loaded from it, and the trained policy written back in the same format.

Nothing is downloaded: a directory is read as it is (`local_files_only`), and a hub id
("Qwen/Qwen3-1.7B") is looked up only in the local Hugging Face cache. Importable without torch
(preflight reads configs, tokenizers and safetensors headers on machines without the train extra);
`load_model` and `export` import it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import GgpoError
from . import checkpoint_files

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Config keys of dropout probabilities across the supported families (Llama/Qwen/Mistral use
# attention_dropout, GPT-2 the *_pdrop ones): all set to 0 at load, so behaviour, policy and
# reference log-probs agree on identical weights.
DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "dropout",
                "activation_dropout", "summary_first_dropout")


class CheckpointError(GgpoError):
    """A model path that is absent or cannot be read as a Hugging Face causal LM."""

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent  # the checkpoint is simply not on this machine


def looks_like_hub_id(value: str) -> bool:
    return bool(HUB_ID.match(value)) and not value.startswith((".", "~"))


def resolve(path: str) -> Path:
    """The local directory of `path`: a directory, or a hub id found in the local HF cache."""
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    if p.exists():
        raise CheckpointError(f"{path} is not a directory")
    if looks_like_hub_id(path):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(path, local_files_only=True))
        except Exception as exc:  # noqa: BLE001  (LocalEntryNotFoundError and kin: not cached)
            raise CheckpointError(
                f"{path!r} is neither a directory nor in the local Hugging Face cache on this machine (nothing is "
                f"downloaded at run time; fetch it beforehand, e.g. `huggingface-cli download {path}`): "
                f"{type(exc).__name__}", absent=True) from None
    raise CheckpointError(f"{path} is absent from this machine", absent=True)


def load_config(folder: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


def is_causal_lm(config: Any) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return getattr(config, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


CHAT_TEMPLATE_JSON = "chat_template.json"


def load_tokenizer(folder: str | Path) -> Any:
    """The checkpoint's tokenizer, with the chat template of chat_template.json where
    tokenizer_config.json has none (Gemma-3 4B and up, many repacks: the processor's file, which
    AutoTokenizer does not read); `export` then writes it as the tokenizer's own."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    path = Path(folder) / CHAT_TEMPLATE_JSON
    if not getattr(tokenizer, "chat_template", None) and path.is_file():
        try:
            template = checkpoint_files.read_json(path).get("chat_template")
        except checkpoint_files.CheckpointFileError as exc:
            raise CheckpointError(exc.problem) from None
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            template = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if isinstance(template, (str, dict)) and template:
            tokenizer.chat_template = template
    return tokenizer


def eos_ids(folder: str | Path) -> list[int]:
    """End-of-turn ids of generation_config.json (instruct models list the chat end token there);
    where that file is absent, config.json's own `eos_token_id` (gemma-3: [1, 106])."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            value = checkpoint_files.read_json(path).get("eos_token_id")
        except checkpoint_files.CheckpointFileError as exc:
            raise CheckpointError(exc.problem) from None
        ids = value if isinstance(value, list) else [value]
        return [int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)]
    return []


def check_folder(folder: Path) -> list[str]:
    """What would make libraries read outside the folder, block or fail on it: one phrase per
    problem ("<file>: what is wrong"; ggpo_batch/train/pretrained/checkpoint_files.py)."""
    return checkpoint_files.folder_problems(folder)


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files (a sharded index or single files)."""
    try:
        return checkpoint_files.weight_files(folder)
    except checkpoint_files.CheckpointFileError as exc:
        raise CheckpointError(exc.problem) from None


def safetensors_parameters(files: list[Path]) -> int:
    """Number of stored tensor elements, read from the safetensors headers alone (no weights loaded)."""
    try:
        return checkpoint_files.parameters(files)
    except checkpoint_files.CheckpointFileError as exc:
        raise CheckpointError(exc.problem) from None


def load_model(folder: Path, *, dtype: str, attn_implementation: str, gradient_checkpointing: bool) -> Any:
    """The policy from `folder` in `dtype`, dropout off; train mode only to let checkpointing run."""
    import torch
    from transformers import AutoModelForCausalLM

    config = load_config(folder)
    for key in DROPOUT_KEYS:
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(str(folder), config=config, local_files_only=True,
                                                 dtype=getattr(torch, dtype), attn_implementation=attn_implementation)
    return training_mode(model, gradient_checkpointing)


def training_mode(model: Any, gradient_checkpointing: bool) -> Any:
    """`model` set up as the policy trains (returned): with gradient checkpointing (non-reentrant, the
    KV cache off) in train mode, else in eval mode. Dropout must already be 0 (`load_model` sees to
    it; tools/gpu/flagship_check.py builds its model from a config with none)."""
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.train()  # HF checkpoints only in training mode; every dropout is 0
    else:
        model.eval()
    return model


def export(model: Any, weights: Mapping[str, Any], folder: Path, tokenizer: Any | None) -> str:
    """Write `weights` (full host tensors, written in their own dtype) as a Hugging Face directory
    `from_pretrained` loads: config, generation config, safetensors, tokenizer. Returns the sha256
    over its files (name and bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in weights.items()}
    config = model.config
    config.use_cache = True
    model.save_pretrained(str(folder), state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    return directory_sha256(folder)


def directory_sha256(folder: Path) -> str:
    """sha256 over every file of `folder` (relative name, then bytes), in name order."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0")
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
