"""The DeepSpeed settings the memory formula (ggpo_batch/train/policy/gpu_memory.py) assumes are the ones the
trainer's engine really runs with: ZeRO's bucket sizes and overlap (the trainer's GPU settings; the
CPU keeps DeepSpeed's defaults), torch's AdamW, and a second communicator (DeepSpeed's clone of the
world group) beside torch's own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytestmark = [pytest.mark.train, pytest.mark.slow]  # a DeepSpeed engine of the tiny checkpoint: a few seconds


def zero_engine(zero: dict):  # type: ignore[no-untyped-def,type-arg]
    """The ZeRO optimizer of a DeepSpeed engine of a small module built with these settings."""
    import deepspeed

    module = torch.nn.Linear(8, 8)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=module, model_parameters=module.parameters(), config=config)
    return engine.optimizer


def test_the_trainers_engine_runs_with_the_settings_the_formula_assumes(one_rank, hf_spec):  # type: ignore[no-untyped-def]
    import torch.distributed as dist
    from deepspeed.utils import groups

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy import gpu_memory
    from ggpo_batch.train.run.trainer import Trainer

    spec = hf_spec("clean", budget=1e9)
    trainer = Trainer(spec, TrainConfig.from_table(spec.train, "t"), rank=0, world=1, device=torch.device("cpu"),
                      budget_seconds=1e9)
    try:
        zero = trainer.engine.optimizer
        # On the CPU the trainer leaves ZeRO's communication at DeepSpeed's defaults ...
        assert gpu_memory.zero_communication(False) == {}
        assert (zero.reduce_bucket_size, zero.overlap_comm, zero.contiguous_gradients) == (500_000_000, False, True)
        # ... on a GPU it adds these, which an engine reads back as the formula's values.
        gpu_zero = zero_engine({"stage": 2, **gpu_memory.zero_communication(True)})
        assert gpu_zero.reduce_bucket_size == gpu_memory.REDUCE_BUCKET_ELEMENTS
        assert gpu_zero.allgather_bucket_size == gpu_memory.ALLGATHER_BUCKET_ELEMENTS
        assert gpu_zero.overlap_comm is gpu_memory.OVERLAP_COMM and gpu_zero.contiguous_gradients
        assert type(trainer.engine.basic_optimizer) is torch.optim.AdamW  # foreach AdamW: the adam_step term
        # Gradients accumulated and reduced in float32 (the gradients and fp32_gradients terms).
        assert zero.gradient_accumulation_dtype == torch.float32 == zero.communication_data_type
        # ZeRO reduces over DeepSpeed's own group: a communicator of its own beside torch's world group.
        assert zero.dp_process_group is groups._WORLD_GROUP and groups._WORLD_GROUP is not dist.group.WORLD
        assert gpu_memory.TRAINER_COMMUNICATORS == 2
    finally:
        trainer.close()
