"""What an allocation runs for one attempt: the method's job for a run spec.

Executors submit the callable returned here; submitit pickles it for the allocation (the queue
itself only ever carries the JSON run spec).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..contracts.allocation import checkpoint_folder, evaluation_record_path
from ..contracts.canary_spec import CANARY_RECORD_FILE, CanarySpec
from ..contracts.evaluation_spec import EvaluationSpec
from ..contracts.runspec import RunSpec
from ..errors import ExecutorError


def make_payload(spec: RunSpec | EvaluationSpec | CanarySpec, output: Path) -> Callable[[], Any]:
    """The callable that trains `spec` inside an allocation and writes its record to `output` (in the
    attempt's folder); its checkpoint goes to the run's folder, where the run's next attempt finds it.
    An evaluation after training writes its evaluation record in the same folder instead, a canary its
canary record."""
    if isinstance(spec, CanarySpec):  # the canary before a sweep writes its record beside (canary_spec.py)
        from ..train.run.canary import CanaryJob

        return CanaryJob(spec.to_json(), str(Path(output).parent / CANARY_RECORD_FILE))
    if isinstance(spec, EvaluationSpec):
        from ..train.run.eval_job import EvaluationJob

        return EvaluationJob(spec.to_json(), str(evaluation_record_path(Path(output).parent)))
    if spec.method == "ggpo":
        from ..train.run.job import TrainingJob

        return TrainingJob(spec.to_json(), str(output), str(checkpoint_folder(Path(output).parent)))
    raise ExecutorError(f"method {spec.method!r} has no training job (known: ggpo)")


def preload_payloads(*, vllm: bool = False) -> bool:
    """Import what the training payloads import (torch, DeepSpeed, the trainer; with `vllm`, vLLM too)
    in this process, so payload processes it forks start with them loaded; False where the train
    extra is not installed (a submit-only worker, whose jobs never train here)."""
    try:
        from ..train.run.job import preload

        preload(vllm=vllm)
        return True
    except ImportError:
        return False
