"""vLLM's model-information cache, filled once for the architectures the suite's engines serve.

vLLM inspects a model class (which interfaces it has: multimodal, pooling, ...) in a subprocess of
its own (`python -m vllm.model_executor.models.registry`, about 10 CPU-s: it imports torch and the
model's module) unless `VLLM_CACHE_ROOT/modelinfos` holds the answer for that module's hash. The
suite shares one cache root (tests/conftest.py), but its vLLM tests start first and together
(`_heavy_first`): on a cold cache each engine and each rank inspected the same two classes at once,
8 subprocesses and 84 CPU-s in a full run. Before a vLLM test runs, `ensure()` has one process (under
a lock) inspect each architecture through vLLM's own registry, which writes the cache; the others
wait for it and then read it. A failure here only leaves the cache cold, as before.

    python -m tests.support.vllm_model_info     # inspect each architecture (what ensure() runs)
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

# What the suite's engines serve: the tiny pretrained checkpoints (Qwen2, tests/train/hf) and the
# built-in policy saved for vLLM (GPT-2).
ARCHITECTURES = ("Qwen2ForCausalLM", "GPT2LMHeadModel")
_ready = False


def _cache() -> Path:
    return Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm") / "modelinfos"


def cold(cache: Path) -> list[str]:
    """The architectures the cache holds no answer for (vLLM still checks each answer's module hash)."""
    return [arch for arch in ARCHITECTURES if not any(cache.glob(f"*-{arch}.json"))]


def ensure() -> None:
    """Fill the cache for ARCHITECTURES unless it holds them; one process at a time does it."""
    global _ready
    if _ready:
        return
    cache = _cache()
    if cold(cache):
        cache.mkdir(parents=True, exist_ok=True)
        with open(cache.parent / "modelinfos.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if cold(cache):
                subprocess.run([sys.executable, "-m", "tests.support.vllm_model_info"], cwd=REPO, timeout=600,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    _ready = True


def main() -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in cold(_cache()):
        ModelRegistry.models[arch].inspect_model_cls()  # vLLM's inspection, which writes the cache


if __name__ == "__main__":
    main()
