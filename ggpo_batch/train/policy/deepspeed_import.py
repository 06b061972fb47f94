"""DeepSpeed imported the way every rank here needs it: one home for three workarounds.

- Its autotuner imports mlflow if installed (1.5 s a rank); nothing here autotunes, so that import
  is made to fail at once while DeepSpeed loads. mlflow itself stays importable.
- Its ZeRO engines import DeepSpeed's Muon optimizer (in `deepspeed.initialize`, and again in each
  ZeRO-1/2 gradient reduction, `average_tensor`, to ask whether the optimizer is one), and that
  module wraps three functions in `torch.compile` as it loads, which imports torch._inductor: about
  1 CPU-second in every rank started as its own interpreter (`tools/bench/fresh_rank_imports.py`).
  The trainer's optimizer is AdamW (`policy/engine_config.py`; a spec cannot choose Muon), so the
  module is imported here first with DeepSpeed's compile decorator left out: the class it is asked
  about is the same, its Muon functions (never called here) stay uncompiled.
- On CPU, the first process group DeepSpeed makes (ours in job.init_process_group, or the one
  `deepspeed.initialize` makes when torch's was made first) JIT-builds its shared-memory all-reduce
  op under a lock file in ~/.cache/torch_extensions: two minutes of compiling on a 2-core machine,
  and a rank killed while it holds the lock leaves every later CPU job waiting on it for ever. The
  op serves only DeepSpeed's inference all-reduce, and only when LOCAL_SIZE is set, which nothing
  here sets: on CPU it is switched off.
"""

from __future__ import annotations

import sys
from types import ModuleType

SHM_OP = "deepspeed_shm_comm"
MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_deepspeed(cuda: bool | None = None) -> ModuleType:
    """DeepSpeed, without the autotuner's mlflow import, with its Muon optimizer loaded uncompiled and
    (on CPU) without its shared-memory op. `cuda`: whether ranks use GPUs (default: whether torch
    sees one)."""
    if "deepspeed" not in sys.modules and "mlflow" not in sys.modules:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # an import of it fails at once
        try:
            import deepspeed
        finally:
            del sys.modules["mlflow"]
    import deepspeed

    if MUON not in sys.modules:
        _import_uncompiled(MUON)
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        deepspeed.ops.__compatible_ops__[SHM_OP] = False
    return deepspeed


def _import_uncompiled(name: str) -> None:
    """Import `name` while DeepSpeed's `compiler.compile()` hands out a decorator that compiles nothing."""
    import importlib

    from deepspeed.runtime import compiler

    real = compiler.compile
    compiler.compile = lambda: compiler.dummy_decorator
    try:
        importlib.import_module(name)
    finally:
        compiler.compile = real
