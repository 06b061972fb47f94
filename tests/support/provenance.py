"""Planted differences for provenance tests: a throwaway git checkout of the package, and a fake
`nvidia-smi` (a real executable, found on PATH like the real one)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .paths import REPO

_GIT = ["git", "-c", "user.name=ggpo test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false"]


def package_checkout(folder: Path) -> Path:
    """A git checkout holding a copy of this checkout's package (ggpo_batch/, setup.cfg, .gitignore),
    with one commit: nightly/provenance.py takes it for a ggpo-batch checkout."""
    folder.mkdir(parents=True)
    shutil.copytree(REPO / "ggpo_batch", folder / "ggpo_batch", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", ".gitignore"):
        shutil.copy2(REPO / name, folder / name)
    subprocess.run([*_GIT, "init", "-q", str(folder)], check=True)
    commit(folder, "the package as it is")
    return folder


def commit(checkout: Path, message: str) -> str:
    """Commit everything in `checkout`; its new HEAD."""
    subprocess.run([*_GIT, "-C", str(checkout), "add", "-A"], check=True)
    subprocess.run([*_GIT, "-C", str(checkout), "commit", "-q", "-m", message], check=True)
    return head(checkout)


def head(checkout: Path) -> str:
    """The commit `checkout` is at."""
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def fake_nvidia_smi(folder: Path, name: str, *, count: int = 1, memory_mib: int = 81559, driver: str = "550.54.15",
                    exit_code: int = 0) -> Path:
    """`folder`/nvidia-smi answering the probe's query with `count` GPUs called `name` (or those its
    --id= names), noting its arguments in nvidia-smi.args."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "nvidia-smi"
    program.write_text(f"""#!/bin/sh
echo "$@" > "{folder}/nvidia-smi.args"
[ {exit_code} -eq 0 ] || {{ echo "NVIDIA-SMI has failed" >&2; exit {exit_code}; }}
ids=$(printf '%s\\n' "$@" | sed -n 's/^--id=//p' | tr ',' ' ')
[ -n "$ids" ] || ids=$(seq 0 {count - 1})
for i in $ids; do echo "{name}, {memory_mib}, {driver}"; done
""")
    program.chmod(0o755)
    return program
