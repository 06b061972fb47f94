"""DeepSpeed imported the way every rank here needs it: one home for two workarounds.

- Its autotuner imports mlflow if installed (1.5 s a rank); nothing here autotunes, so that import
  is made to fail at once while DeepSpeed loads. mlflow itself stays importable.
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


def import_deepspeed(cuda: bool | None = None) -> ModuleType:
    """DeepSpeed, without the autotuner's mlflow import and (on CPU) without its shared-memory op.
    `cuda`: whether ranks use GPUs (default: whether torch sees one)."""
    if "deepspeed" not in sys.modules and "mlflow" not in sys.modules:
        sys.modules["mlflow"] = None  # type: ignore[assignment]  # an import of it fails at once
        try:
            import deepspeed
        finally:
            del sys.modules["mlflow"]
    import deepspeed

    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if not cuda:
        deepspeed.ops.__compatible_ops__[SHM_OP] = False
    return deepspeed
