"""What `ggpo-batch init DIR` writes: an experiment spec to edit (its paths relative to it), the small
generated QA set it names, a Slurm profile to edit, and the packaged example specs.

Nothing is overwritten unless asked: every target is checked before the first file is written, so
a refusal leaves DIR as it was.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..common.datafiles import EXAMPLES_DIR, PACKAGED_DIR, STARTER_DIR, search_path
from ..errors import GgpoError

SPEC_NAME = "experiment.toml"
PROFILE_NAME = "my-cluster"
# The generated QA set: enough eval items for the starter's exposed_items and eval_size.
TRAIN_ITEMS, EVAL_ITEMS = 32, 16
DATA_FILES = ("train.jsonl", "eval.jsonl", "passages.jsonl")


class InitRefused(GgpoError):
    """`init` would overwrite a file, or cannot write its folder: exit 2, nothing written."""


@dataclass(frozen=True)
class Written:
    folder: Path
    spec: Path
    profile: Path
    files: tuple[Path, ...]


def targets(folder: Path) -> dict[str, Path]:
    """Every file `init` writes under `folder`, by role."""
    out = {"spec": folder / SPEC_NAME, "profile": folder / "profiles" / f"{PROFILE_NAME}.toml"}
    out.update({f"data/{name}": folder / "data" / name for name in DATA_FILES})
    out.update({f"examples/{p.name}": folder / "examples" / p.name for p in sorted(EXAMPLES_DIR.glob("*.toml"))})
    return out


def _profile_text() -> str:
    user_dir, site_dir, _packaged = search_path("profiles")
    return (f"# Written by `ggpo-batch init`: a copy of the packaged default.toml. To use it, install it where\n"
            f"# profiles are looked up and name it in the spec (executor = \"slurm\", profile = \"{PROFILE_NAME}\"):\n"
            f"#   mkdir -p {user_dir} && cp profiles/{PROFILE_NAME}.toml {user_dir}/\n"
            f"# (yours; {site_dir}/ for every user of this host).\n"
            + (PACKAGED_DIR / "profiles" / "default.toml").read_text())


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _check_in_place(folder: Path, files: dict[str, Path]) -> None:
    """Refuse a target that is something other than a file or a link (a FIFO, a folder), and a
    subfolder that is a link: init replaces links, never writes through them."""
    for path in files.values():
        parent = path.parent
        if parent != folder and parent.is_symlink():
            raise InitRefused(f"{parent}: is a link; init does not write through links (remove it)")
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            raise InitRefused(f"{path}: {_kind(mode)} is there, not a file; nothing written (remove it)")


def write_starter(folder: Path, *, force: bool = False) -> Written:
    """Write the starter into `folder` (created if missing). Refuses (InitRefused) when a target
    exists and `force` is off, or when the folder cannot be written; then nothing is written.
    Each file is written beside its place and renamed onto it, so a link there is replaced, never
    written through (nothing outside `folder` is touched)."""
    from ..train.task.tiny_hf import build_qa_set

    folder = Path(folder)
    files = targets(folder)
    if folder.exists() and not folder.is_dir():
        raise InitRefused(f"{folder}: exists and is not a folder")
    existing = [p for p in files.values() if p.exists() or p.is_symlink()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise InitRefused(f"{existing[0]}: exists{more}; nothing written (--force replaces them)")
    _check_in_place(folder, files)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder, prefix=".ggpo-init-") as tmp:
            staged = {role: Path(tmp) / path.relative_to(folder) for role, path in files.items()}
            for path in staged.values():
                path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(STARTER_DIR / SPEC_NAME, staged["spec"])
            staged["profile"].write_text(_profile_text())
            build_qa_set(staged["spec"].parent / "data", n_train=TRAIN_ITEMS, n_eval=EVAL_ITEMS)
            for role, path in staged.items():
                if role.startswith("examples/"):
                    shutil.copyfile(EXAMPLES_DIR / path.name, path)
            for role, path in files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged[role], path)  # replaces a link itself, never its target
    except OSError as exc:
        raise InitRefused(f"{exc.filename or folder}: cannot write ({exc.strerror or exc})") from None
    return Written(folder=folder, spec=files["spec"], profile=files["profile"], files=tuple(files.values()))
