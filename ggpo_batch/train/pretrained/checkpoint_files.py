"""A checkpoint folder's files, read as untrusted files (ggpo_batch/common/untrusted_files.py) before any
library opens them: a model folder is downloaded, copied or linked by hand, and transformers would
block on a FIFO named config.json, read /dev/zero through a link, or follow an index entry to
/etc/shadow.

Nothing outside the folder is read: every entry, once its links are followed, must lie in it (a
Hugging Face cache snapshot, `.../models--org--name/snapshots/<commit>`, counts as one folder with
that model's `blobs`, where its files link to) and be a regular file or a folder. The JSON files
(config, generation config, tokenizer config, the weight index) are read whole within a size and
the limits of every input; the tokenizer's other files are checked for kind and size (the tokenizer
library parses them); each safetensors header is read and checked against the file (its length,
dtypes, whole-number shapes, data offsets within the file and matching the shapes). Every problem
is one phrase "<file>: what is wrong", which preflight puts under `train.model.path`.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from pathlib import Path, PurePosixPath
from typing import Any

from ...common import limits
from ...common.untrusted_files import FileRefused, inside, kind_of, open_regular, read_range, read_whole, real_roots

MODEL_FOLDER = "the model folder"
# config.json and its kin: the largest seen is gemma-3's tokenizer_config.json, 1,156,999 bytes (its
# 262k-entry added_tokens_decoder); R1-Distill-Qwen-32B's weight index is 64 kB.
JSON_MAX_BYTES = 16 << 20
# tokenizer.json: gemma-3's is 33.4 MB, the largest seen (Qwen3's 11.4 MB, Llama-3's ~9 MB).
TOKENIZER_MAX_BYTES = 512 << 20
HEADER_MAX_BYTES = 100 << 20  # a safetensors header (the format's own limit)
ENTRIES_MAX = 100_000  # files and folders in a model folder
INDEX_NAME = "model.safetensors.index.json"
# Files transformers reads as JSON (Python's parser: unbounded nesting, 5,000-digit numbers, NaN).
JSON_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
              "added_tokens.json", "chat_template.json", "preprocessor_config.json", INDEX_NAME)
# Files the tokenizer library reads itself.
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model", "spiece.model",
                   "chat_template.jinja")
# Bits per element of every dtype the safetensors format names (its Rust crate's `Dtype::bitsize`):
# the MX types (F8_E8M0 scales, F6_E2M3/F6_E3M2, F4 = float4_e2m1fn packed two to a byte) are under
# 8 bits, so a tensor's data is prod(shape) * bits / 8 bytes, and the format refuses a tensor whose
# bits are not a whole number of bytes.
SAFETENSORS_BITS = {"F64": 64, "F32": 32, "BF16": 16, "F16": 16, "I64": 64, "I32": 32, "I16": 16, "I8": 8, "U8": 8,
                    "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F8_E8M0": 8,
                    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "U16": 16, "U32": 32, "U64": 64, "C64": 64}


class CheckpointFileError(Exception):
    """One file of a checkpoint folder that cannot be used; `problem` is "<file>: what is wrong"."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def roots(folder: Path) -> tuple[Path, ...]:
    """Where the checkpoint's files may lie: the folder, and a cache snapshot's blobs."""
    real = Path(os.path.realpath(folder))
    found = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        found.append(real.parent.parent / "blobs")
    return real_roots(found)


def folder_problems(folder: Path) -> list[str]:
    """Every problem of the folder's files, one phrase each; [] when libraries may read it."""
    where = roots(folder)
    problems = _entries(folder, where)
    if problems:
        return problems
    if not (folder / "config.json").exists():
        return [f"{folder}: has no config.json (not a Hugging Face checkpoint folder)"]
    for name in JSON_FILES:
        if (folder / name).exists():
            try:
                read_json(folder / name, where)
            except CheckpointFileError as exc:
                problems.append(exc.problem)
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.exists() and path.stat().st_size > TOKENIZER_MAX_BYTES:
            problems.append(f"{path}: is {path.stat().st_size:,} bytes; a tokenizer file is at most "
                            f"{TOKENIZER_MAX_BYTES:,}")
    if problems:
        return problems
    try:
        for f in weight_files(folder):
            safetensors_header(f, where)
    except CheckpointFileError as exc:
        problems.append(exc.problem)
    return problems


def _entries(folder: Path, where: tuple[Path, ...]) -> list[str]:
    """Entries of the folder (all levels) that are links leading out of it, or neither files nor folders."""
    problems: list[str] = []
    count = 0
    for dirpath, dirnames, filenames in os.walk(folder):  # links to folders are listed, not walked
        for name in (*dirnames, *filenames):
            count += 1
            if count > ENTRIES_MAX:
                return [f"{folder}: holds over {ENTRIES_MAX:,} files and folders; not a checkpoint folder"]
            path = Path(dirpath) / name
            try:
                mode = os.stat(inside(path, where, MODEL_FOLDER)).st_mode
            except FileRefused as exc:
                problems.append(f"{path}: {exc.problem}")
                continue
            except OSError as exc:
                problems.append(f"{path}: cannot be read ({exc.strerror})")
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                problems.append(f"{path}: is {kind_of(mode)}, not a regular file; it is not read")
    return problems


def read_json(path: Path, where: tuple[Path, ...] | None = None) -> dict[str, Any]:
    """A JSON object file of the checkpoint, read within JSON_MAX_BYTES and the limits of every input."""
    where = roots(path.parent) if where is None else where
    try:
        raw = read_whole(path, where, MODEL_FOLDER, max_bytes=JSON_MAX_BYTES)
        data = limits.load_json(raw, ledger=False)
    except (FileRefused, limits.InputRefused) as exc:
        raise CheckpointFileError(f"{path}: {exc.problem}") from None
    if not isinstance(data, dict):
        raise CheckpointFileError(f"{path}: must hold a JSON object, holds {type(data).__name__}")
    return data


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names (each a relative name inside the
    folder), else every *.safetensors file."""
    index = folder / INDEX_NAME
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointFileError(f"{index}: weight_map must be a non-empty object of tensor name -> file")
    names = set()
    for tensor, name in weight_map.items():
        parts = PurePosixPath(name).parts if isinstance(name, str) else ()
        if not parts or name.startswith("/") or ".." in parts or "\\" in name:
            shown = repr(name)[:80]
            raise CheckpointFileError(f"{index}: weight_map[{tensor[:60]!r}] = {shown} is not a file name inside "
                                      f"{MODEL_FOLDER}; nothing outside it is read")
        names.add(name)
    return [folder / n for n in sorted(names)]


def safetensors_header(path: Path, where: tuple[Path, ...] | None = None) -> dict[str, dict[str, Any]]:
    """The tensors of a safetensors file ({name: {dtype, shape, data_offsets}}), from its header
    alone, checked against the file (CheckpointFileError names the file and what is wrong)."""
    where = roots(path.parent) if where is None else where
    try:
        with open_regular(path, where, MODEL_FOLDER) as (fd, st):
            size = st.st_size
            if size < 8:
                raise CheckpointFileError(f"{path}: is {size} bytes: not a safetensors file (empty or truncated)")
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            if n > min(HEADER_MAX_BYTES, size - 8):
                raise CheckpointFileError(f"{path}: its header would be {n:,} bytes, the file has {size - 8:,} after "
                                          f"its length: truncated, or not a safetensors file")
            raw = read_range(fd, 8, n)
    except FileRefused as exc:
        raise CheckpointFileError(f"{path}: {exc.problem}") from None
    try:
        header = limits.load_json(raw, ledger=False)
    except limits.InputRefused as exc:
        raise CheckpointFileError(f"{path}: its header {exc.problem}") from None
    if not isinstance(header, dict):
        raise CheckpointFileError(f"{path}: its header must be a JSON object")
    data_bytes = size - 8 - n
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        where_t = f"{path}: tensor {name[:60]!r}"
        if not isinstance(meta, dict):
            raise CheckpointFileError(f"{where_t}: is not a tensor entry")
        dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
        if dtype not in SAFETENSORS_BITS:
            raise CheckpointFileError(f"{where_t}: unknown dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise CheckpointFileError(f"{where_t}: shape {str(shape)[:60]} is not a list of whole numbers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool)
                                                                        for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise CheckpointFileError(f"{where_t}: data_offsets {str(offsets)[:60]} are not [begin, end]")
        if offsets[1] > data_bytes:
            raise CheckpointFileError(f"{where_t}: its data ends at byte {offsets[1]:,}, the file holds {data_bytes:,}: "
                                      f"truncated")
        bits = math.prod(shape) * SAFETENSORS_BITS[dtype]
        if bits % 8:
            raise CheckpointFileError(f"{where_t}: shape {shape} of {dtype} is {bits:,} bits, not a whole number of "
                                      f"bytes")
        expected = bits // 8
        if expected != offsets[1] - offsets[0]:
            raise CheckpointFileError(f"{where_t}: shape {shape} of {dtype} is {expected:,} bytes, its data "
                                      f"{offsets[1] - offsets[0]:,}")
        tensors[name] = meta
    return tensors


def parameters(files: list[Path], where: tuple[Path, ...] | None = None) -> int:
    """Tensor elements stored in `files`, from their headers alone (no weights loaded)."""
    return sum(math.prod(meta["shape"]) for f in files for meta in safetensors_header(f, where).values())
