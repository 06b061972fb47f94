"""The package's wheel, built from the build context and installed into a fresh venv outside the
checkout (tests/test_wheel.py; tools/check/dockerfile.py runs the image's own pip steps)."""

from __future__ import annotations

import importlib.util
import shutil
import site
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support.paths import REPO

DOCKERFILE_CHECK = REPO / "tools" / "check" / "dockerfile.py"
# Run inside the fresh venv: the requirements of the installed ggpo-batch (base and EXTRAS) that
# the environment does not meet, as JSON, with where ggpo-batch's metadata was found.
UNMET_REQUIREMENTS = """
import importlib.metadata as md, json, sys
from packaging.requirements import Requirement

def unmet(lines, extras):
    out = []
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(f"{req}: not installed")
            continue
        if not req.specifier.contains(version, prereleases=True):
            out.append(f"{req}: {version} installed")
    return out

if __name__ == "__main__":
    dist = md.distribution("ggpo-batch")
    print(json.dumps({"metadata": str(dist.locate_file("")), "unmet": unmet(dist.requires or [], sys.argv[1:])}))
"""


def dockerfile_check() -> ModuleType:
    """tools/check/dockerfile.py as a module."""
    spec = importlib.util.spec_from_file_location("dockerfile_check", DOCKERFILE_CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def build_wheel(folder: Path) -> Path:
    """`pip wheel . --no-deps` of a copy of the build context (what a clone and .dockerignore leave:
    a stale build/ folder or an untracked cache never reaches the wheel). Built without build
    isolation: with this environment's setuptools, offline, in seconds."""
    src = folder / "src"
    for rel in dockerfile_check().context_files(REPO):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    out = folder / "wheelhouse"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out)], check=True, capture_output=True, timeout=300)
    [wheel] = out.glob("ggpo_batch-*.whl")
    return wheel


def fresh_venv(folder: Path, wheel: Path) -> Path:
    """A new venv with `wheel` installed (no dependencies), then this environment's site-packages
    added to its path by a .pth line (its own .pth files are not run, so an editable install of
    the checkout there stays invisible). Returns the venv's folder."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    # pip runs on the new interpreter: before the link, it sees only the empty venv
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True, timeout=300)
    [purelib] = (venv / "lib").glob("python3*/site-packages")
    (purelib / "_ggpo_test_shared_env.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return venv
