"""Provenance of a component run: the commit, whether the executed source was uncommitted,
and the sha256 of the implementation and of every source file that actually ran.

The one place that knows about a checkout: source files are keyed by their path from the folder
that holds the package (`ggpo_batch/train/policy/ggpo.py` from a checkout and from an installed wheel
alike); the commit and the uncommitted flag come from git only when that folder is a ggpo-batch
checkout (`REPO_DIR`), never from a repository that merely encloses an installed package."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

# The folder that holds the package: a checkout's root, or site-packages for an installed wheel.
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def _checkout(root: Path) -> Path | None:
    """`root` if it is a ggpo-batch checkout (a git work tree with the project's setup.cfg), else None."""
    setup = root / "setup.cfg"
    if (root / ".git").exists() and setup.is_file() and "name = ggpo-batch" in setup.read_text(errors="replace"):
        return root
    return None


# The checkout the package runs from; None when it runs from an installed wheel.
REPO_DIR = _checkout(PACKAGE_PARENT)


def sha256_path(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def executed_sources(package: str = "ggpo_batch", root: Path = PACKAGE_PARENT,
                     extra: Iterable[Path] = ()) -> dict[str, str]:
    """sha256 of each loaded module file of `package` (plus `extra` files), keyed by the path from
    `root` (files outside it by their absolute path)."""
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


def relative_to_checkout(path: Path) -> str:
    """`path` from the checkout's root when it is inside the checkout, else as given."""
    if REPO_DIR is not None:
        try:
            return path.resolve().relative_to(REPO_DIR).as_posix()
        except ValueError:
            pass
    return str(path)


def git_commit(root: Path | None = REPO_DIR) -> str | None:
    """The checkout's HEAD; None outside a checkout or when git cannot tell."""
    if root is None:
        return None
    out = _git(root, "rev-parse", "HEAD")
    return out.strip() if out else None


def uncommitted(paths: Iterable[str], root: Path | None = REPO_DIR) -> bool | None:
    """True when any of `paths` differs from HEAD or is untracked; None outside a checkout or when
    git cannot tell."""
    rel = [p for p in paths if not Path(p).is_absolute()]
    if root is None or not rel:
        return None
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *rel)
    if out is None:
        return None
    return bool(out.strip())


def uncommitted_sha256(package: str = "ggpo_batch", root: Path | None = REPO_DIR) -> str | None:
    """sha256 of the package's uncommitted changes in the checkout (its diff against HEAD, then the
    name and bytes of each untracked file, compiled files left out); None when it has none, outside
    a checkout, or when git cannot tell. Two runs with the same commit and this same hash ran the
    same source."""
    if root is None:
        return None
    diff = _git(root, "diff", "HEAD", "--binary", "--no-color", "--", package)
    others = _git(root, "ls-files", "-z", "--others", "--exclude-standard", "--", package)
    if diff is None or others is None:
        return None
    h = hashlib.sha256(diff.encode())
    untracked = sorted(p for p in others.split("\0") if p and not p.endswith((".pyc", ".pyo")) and "__pycache__" not in p)
    for rel in untracked:
        h.update(b"\0" + rel.encode() + b"\0")
        try:
            h.update((root / rel).read_bytes())
        except OSError:
            h.update(b"<unreadable>")
    return h.hexdigest() if diff or untracked else None


def checkout_code() -> dict[str, str | None] | None:
    """The code of the checkout the package runs from: its commit and the hash of the package's
    uncommitted changes (`uncommitted_sha256`); None when the package runs from an installed wheel."""
    if REPO_DIR is None:
        return None
    return {"commit": git_commit(REPO_DIR), "uncommitted_sha256": uncommitted_sha256(root=REPO_DIR)}
