"""What is stored outside the process keeps loading across the package layout: the RQ job function
paths Redis holds, submitit's pickled jobs naming the old module paths, and run checkpoints whose
pickles name classes under their old modules (train/audit/checkpoint_pickle.py)."""

from __future__ import annotations

import io
import pickle
import sys
import types
from collections import Counter

import cloudpickle
import pytest
import torch
from rq.utils import import_attribute

from ggpo_batch.control import worker
from ggpo_batch.control.queue import EVALUATION_JOB_FUNC, JOB_FUNC
from ggpo_batch.train.audit import checkpoint_pickle
from ggpo_batch.train.audit.audit import StepEvidence, TrajectoryEvidence
from ggpo_batch.train.audit.checkpoint import LoopState
from ggpo_batch.train.run.eval_job import EvaluationJob
from ggpo_batch.train.run.job import TrainingJob
from ggpo_batch.train.task.qa import Item


def test_the_job_function_paths_redis_stores_resolve_to_the_control_worker() -> None:
    assert JOB_FUNC == "ggpo_batch.worker.execute_run"
    assert EVALUATION_JOB_FUNC == "ggpo_batch.worker.execute_evaluation"
    assert import_attribute(JOB_FUNC) is worker.execute_run
    assert import_attribute(EVALUATION_JOB_FUNC) is worker.execute_evaluation
    assert import_attribute("ggpo_batch.nightly.schedule.nightly_job").__module__ == "ggpo_batch.nightly.schedule"


def _pickled_as(cls: type, old_module: str, obj: object) -> bytes:
    """`obj` pickled as an earlier release did: its class named under `old_module`."""
    real = cls.__module__
    cls.__module__ = old_module
    try:
        return cloudpickle.dumps(obj)
    finally:
        cls.__module__ = real


@pytest.mark.parametrize("cls, old", [(TrainingJob, "ggpo_batch.train.job"),
                                      (EvaluationJob, "ggpo_batch.train.eval_job")])
def test_a_submitit_job_pickled_under_the_old_path_loads(cls: type, old: str) -> None:
    obj = cls.__new__(cls)
    data = _pickled_as(cls, old, obj)
    assert old.encode() in data
    assert type(pickle.loads(data)) is cls


def test_a_checkpoint_naming_the_old_class_paths_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    state = LoopState(step=3, tally=Counter(a=1), exposed_items={"q1"})
    item = Item("q1", "question?", ("answer",))
    evidence = StepEvidence.__new__(StepEvidence)
    trajectory = TrajectoryEvidence.__new__(TrajectoryEvidence)
    # The old modules as they were: train/batch.py, the flat train/audit.py and train/task.py.
    old = {"ggpo_batch.train.batch": [LoopState], "ggpo_batch.train.audit": [StepEvidence, TrajectoryEvidence],
           "ggpo_batch.train.task": [Item]}
    real = {c: c.__module__ for classes in old.values() for c in classes}
    for name, classes in old.items():
        mod = types.ModuleType(name)
        for c in classes:
            setattr(mod, c.__name__, c)
            c.__module__ = name
        monkeypatch.setitem(sys.modules, name, mod)
    buf = io.BytesIO()
    try:
        torch.save({"state": state, "evidence": [evidence, trajectory], "item": item}, buf)
    finally:
        for c, m in real.items():
            c.__module__ = m
    for name in old:
        monkeypatch.delitem(sys.modules, name)
    raw = buf.getvalue()
    with pytest.raises((AttributeError, ModuleNotFoundError)):
        torch.load(io.BytesIO(raw), weights_only=False)  # without the rename table it does not load
    saved = torch.load(io.BytesIO(raw), weights_only=False, pickle_module=checkpoint_pickle)
    assert type(saved["state"]) is LoopState and saved["state"].step == 3
    assert [type(e) for e in saved["evidence"]] == [StepEvidence, TrajectoryEvidence]
    assert type(saved["item"]) is Item and saved["item"].item_id == "q1"
