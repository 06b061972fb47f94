"""The DeepSpeed settings the memory formula (ggpo_batch/gpu_memory.py) assumes are the ones the
trainer's engine really runs with: ZeRO's bucket sizes and overlap, torch's AdamW, and a second
communicator (DeepSpeed's clone of the world group) beside torch's own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # a DeepSpeed engine of the tiny checkpoint: a few seconds


def test_the_trainers_engine_runs_with_the_settings_the_formula_assumes(one_rank, hf_spec):  # type: ignore[no-untyped-def]
    import torch.distributed as dist
    from deepspeed.utils import groups

    from ggpo_batch import gpu_memory
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.trainer import Trainer

    spec = hf_spec("clean", budget=1e9)
    trainer = Trainer(spec, TrainConfig.from_table(spec.train, "t"), rank=0, world=1, device=torch.device("cpu"),
                      budget_seconds=1e9)
    try:
        zero = trainer.engine.optimizer
        assert zero.reduce_bucket_size == gpu_memory.REDUCE_BUCKET_ELEMENTS
        assert zero.allgather_bucket_size == gpu_memory.ALLGATHER_BUCKET_ELEMENTS
        assert zero.overlap_comm is gpu_memory.OVERLAP_COMM[2] and zero.contiguous_gradients
        assert type(trainer.engine.basic_optimizer) is torch.optim.AdamW  # foreach AdamW: the adam_step term
        # ZeRO reduces over DeepSpeed's own group: a communicator of its own beside torch's world group.
        assert zero.dp_process_group is groups._WORLD_GROUP and groups._WORLD_GROUP is not dist.group.WORLD
        assert gpu_memory.TRAINER_COMMUNICATORS == 2
    finally:
        trainer.close()
