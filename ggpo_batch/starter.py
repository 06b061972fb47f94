"""What `ggpo-batch init DIR` writes: an experiment spec to edit (its paths relative to it), the small
generated QA set it names, a Slurm profile to edit, and the packaged example specs.

Nothing is overwritten unless asked: every target is checked before the first file is written, so
a refusal leaves DIR as it was.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .datafiles import EXAMPLES_DIR, PACKAGED_DIR, STARTER_DIR, search_path
from .errors import GgpoError

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


def write_starter(folder: Path, *, force: bool = False) -> Written:
    """Write the starter into `folder` (created if missing). Refuses (InitRefused) when a target
    exists and `force` is off, or when the folder cannot be written; then nothing is written."""
    from .train.tiny_hf import build_qa_set

    folder = Path(folder)
    files = targets(folder)
    if folder.exists() and not folder.is_dir():
        raise InitRefused(f"{folder}: exists and is not a folder")
    existing = [p for p in files.values() if p.exists() or p.is_symlink()]
    if existing and not force:
        more = f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""
        raise InitRefused(f"{existing[0]}: exists{more}; nothing written (--force replaces them)")
    try:
        for path in files.values():
            path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STARTER_DIR / SPEC_NAME, files["spec"])
        files["profile"].write_text(_profile_text())
        build_qa_set(folder / "data", n_train=TRAIN_ITEMS, n_eval=EVAL_ITEMS)
        for role, path in files.items():
            if role.startswith("examples/"):
                shutil.copyfile(EXAMPLES_DIR / path.name, path)
    except OSError as exc:
        raise InitRefused(f"{exc.filename or folder}: cannot write ({exc.strerror})") from None
    return Written(folder=folder, spec=files["spec"], profile=files["profile"], files=tuple(files.values()))
