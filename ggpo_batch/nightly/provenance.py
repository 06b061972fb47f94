"""Provenance of a component run: the commit, whether the executed source was uncommitted,
and the sha256 of the implementation and of every source file that actually ran."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from ..config import REPO_DIR

log = logging.getLogger(__name__)


def sha256_path(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def executed_sources(package: str = "ggpo_batch", root: Path = REPO_DIR,
                     extra: Iterable[Path] = ()) -> dict[str, str]:
    """sha256 of each loaded module file of `package` (plus `extra` files), keyed by repo-relative path."""
    files: set[Path] = {Path(p).resolve() for p in extra}
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, ModuleType) or not (name == package or name.startswith(package + ".")):
            continue
        origin = getattr(mod, "__file__", None)
        if origin:
            files.add(Path(origin).resolve())
    out: dict[str, str] = {}
    for path in sorted(files):
        try:
            key = path.relative_to(root).as_posix()
        except ValueError:
            key = path.as_posix()
        out[key] = sha256_path(path)
    return out


def git_commit(root: Path = REPO_DIR) -> str | None:
    out = _git(root, "rev-parse", "HEAD")
    return out.strip() if out else None


def uncommitted(paths: Iterable[str], root: Path = REPO_DIR) -> bool | None:
    """True when any of `paths` differs from HEAD or is untracked; None when git cannot tell."""
    rel = [p for p in paths if not Path(p).is_absolute()]
    if not rel:
        return None
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *rel)
    if out is None:
        return None
    return bool(out.strip())
