"""The classes a run checkpoint's `loop_rank*.pt` names, across moves of their modules.

`torch.save` pickles the loop state and the audit's evidence by module path, and a run may resume
from a checkpoint written by an earlier release (a continuation days later). The checkpoint loader
reads it with this module as torch.load's `pickle_module`: an old path is looked up in MOVED first.
"""

from __future__ import annotations

import pickle
from typing import Any

# (old module, class) -> new module: the package layout of issue 37 (old train/ was flat).
MOVED: dict[tuple[str, str], str] = {
    ("ggpo_batch.train.batch", "LoopState"): "ggpo_batch.train.audit.checkpoint",
    ("ggpo_batch.train.audit", "StepEvidence"): "ggpo_batch.train.audit.audit",
    ("ggpo_batch.train.audit", "TrajectoryEvidence"): "ggpo_batch.train.audit.audit",
    ("ggpo_batch.train.task", "Item"): "ggpo_batch.train.task.qa",
    ("ggpo_batch.train.task", "Passage"): "ggpo_batch.train.task.qa",
}


class Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED.get((module, name), module), name)


def load(file: Any, **kwargs: Any) -> Any:
    return Unpickler(file, **kwargs).load()

