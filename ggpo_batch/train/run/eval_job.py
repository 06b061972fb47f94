"""The payload of an evaluation after training: `EvaluationJob(spec_json, output)()` scores one run's
exported policy on a data file of items and writes the evaluation record to `output`.

Each rank loads the exported Hugging Face policy (`from_pretrained`, in the training's dtype), the
run's codec and protocol (its chat template keywords), retrieval over the run's passages, and rolls
out its share of the items through the run's rollout backend (torch, or vLLM as the run's spec
says), with the training's own evaluation code (train/evaluation.py: decoding, episodes, reward).
An item is exposed when the run trained on it (the training details' `trained_item_ids`), whatever
set it is in. Ranks come from submitit or torchrun-style variables, as the training job's do.

The evaluation record (rank 0 writes it, atomically; settlement reads it into the ledger's outcome
set and books this allocation's GPU-hours from its timing):

| key | meaning |
| --- | --- |
| `evaluation_record` | this record's version (EVALUATION_RECORD_VERSION) |
| `run_key`, `name` | the run and the outcome set |
| `data` | `path`, `sha256` (checked against the one validated by `evaluate`), `items` |
| `policy_dir`, `policy_sha256` | the exported policy scored (the training details' `policy_sha256`) |
| `prompts_sha256` | sha256 of the items' prompt token ids as the run's codec renders them (JSON) |
| `rollout`, `world_size`, `gpus`, `dtype` | on what, how |
| `exposure` | `basis` (`trained_item_ids`), `trained_items` (the run's), `exposed_items` (of this set) |
| `evaluation` | train/evaluation.py's summary with its `per_item` rows |
| `timing` | `setup_seconds`, `evaluation_seconds`, `elapsed_seconds` (allocation start to the write) |
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
from pathlib import Path
from typing import Any

from ...config.logs import configure_logging
from ...contracts.allocation import allocation_start, job_log_context
from ...contracts.evaluation_spec import EVALUATION_RECORD_VERSION, EvaluationSpec, file_sha256
from ...errors import GgpoError
from .. import versions
from ..config import TrainConfig
from ..rollout.engine_size import engine_size
from .job import _distributed_env, init_process_group, preload, release_process_group, write_json_atomic

log = logging.getLogger(__name__)


def policy_dtype(cfg: TrainConfig, cuda: bool) -> str:
    """The dtype the run trained in: its checkpoint's, else the built-in model's precision (bf16 on a
    GPU under `auto`, fp32 on the CPU)."""
    if cfg.model is not None:
        return cfg.model.dtype
    return "bfloat16" if cfg.precision == "bf16" or (cfg.precision == "auto" and cuda) else "float32"


def trained_item_ids(details_path: str) -> set[str]:
    """The items the run trained on, from its training details (train/job.py)."""
    try:
        data = json.loads(Path(details_path).read_text())
    except (OSError, ValueError) as exc:
        raise GgpoError(f"{details_path}: the run's training details cannot be read ({exc})") from None
    ids = data.get("trained_item_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list):
        raise GgpoError(f"{details_path}: no trained_item_ids (a run trained before evaluations existed)")
    return {str(i) for i in ids}


def _corpus(cfg: TrainConfig) -> Any:
    from ..task import qa as task

    if cfg.data is None:
        return task.synthetic(cfg).corpus
    if cfg.data.passages is None:  # a single-turn task: no search tool
        return ()
    return task.read_passages(cfg.data.passages, "train.data.passages")


class EvaluationJob:
    """One evaluation after training (module docstring); picklable for submitit."""

    def __init__(self, spec_json: str, output: str) -> None:
        self.spec_json = spec_json
        self.output = output

    def __call__(self) -> dict[str, Any]:
        t0 = allocation_start()
        spec = EvaluationSpec.from_json(self.spec_json)
        run = spec.run
        cfg = TrainConfig.from_table(run.train, "<run spec>")
        versions.require(versions.needed(cfg), f"the allocation ({socket.gethostname()})")
        rank, world, local_rank, under_submitit = _distributed_env()
        preload()
        import torch

        from ..pretrained.hf import directory_sha256, load_model
        from ..rollout.backends import make_backend
        from ..task import qa as task
        from ..task.codec import make_codec
        from ..task.retrieval import Retriever
        from .evaluation import EVAL_TEMPLATE, evaluate_items

        configure_logging(text_format=f"%(asctime)s rank{rank} %(name)s %(message)s",
                          context=job_log_context(run.run_key, self.output, rank))
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
        init_process_group(cuda)
        backend = None
        try:
            if file_sha256(spec.data_path) != spec.data_sha256:
                raise GgpoError(f"{spec.data_path}: changed since `evaluate` validated it (sha256 differs); "
                                f"evaluate it again under a new name")
            items = task.read_items(spec.data_path, "--data", spec.data_path, kind=cfg.kind,
                                    columns=cfg.data.columns if cfg.data is not None else None)
            trained = trained_item_ids(spec.details_path)
            dtype = policy_dtype(cfg, cuda)
            policy = Path(spec.policy_dir)
            codec = make_codec(cfg, str(policy) if cfg.model is not None else None)
            # vLLM serves a checkpoint's directory itself: the torch copy is needed only to sample
            # with torch, or to hand the built-in model to vLLM.
            model = None
            if cfg.rollout == "torch" or cfg.model is None:
                model = load_model(policy, dtype=dtype, attn_implementation=cfg.model.attn_implementation
                                   if cfg.model is not None else "sdpa", gradient_checkpointing=False).to(device)
            backend = make_backend(cfg.rollout, model, codec, gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                                   seed=run.seed, device_index=device.index,
                                   model_dir=policy if cfg.model is not None else None,
                                   max_model_len=cfg.max_model_len, dtype=dtype,
                                   tensor_parallel_size=cfg.tensor_parallel_size,
                                   size=engine_size(prompts_per_step=0, group_size=1, eval_items=len(items),
                                                    eval_samples=cfg.eval_samples, world=world,
                                                    tensor_parallel_size=cfg.tensor_parallel_size))
            retriever = Retriever(_corpus(cfg))
            setup_seconds = time.time() - t0
            exposed = trained & {it.item_id for it in items}
            t1 = time.time()
            evaluation = evaluate_items(cfg, codec, backend, retriever, items, exposed, planned=len(exposed),
                                        rank=rank, world=world, seed=run.seed)
            evaluation_seconds = time.time() - t1
            # What was scored, checkable: the prompts as the run's codec renders them, and the policy
            # (settlement compares it with the training's export, train/job.py's policy_sha256).
            prompts = json.dumps([codec.prompt(EVAL_TEMPLATE, it) for it in items], separators=(",", ":"))
            record = {
                "evaluation_record": EVALUATION_RECORD_VERSION, "run_key": spec.run_key, "name": spec.name,
                "data": {"path": spec.data_path, "sha256": spec.data_sha256, "items": len(items)},
                "policy_dir": str(policy), "policy_sha256": directory_sha256(policy) if rank == 0 else None,
                "prompts_sha256": hashlib.sha256(prompts.encode()).hexdigest(),
                "rollout": cfg.rollout, "world_size": world, "gpus": spec.gpus,
                "dtype": dtype, "under_submitit": under_submitit,
                "exposure": {"basis": "trained_item_ids", "trained_items": len(trained), "exposed_items": len(exposed)},
                "evaluation": evaluation,
                "timing": {"setup_seconds": setup_seconds, "evaluation_seconds": evaluation_seconds,
                           "elapsed_seconds": time.time() - t0},
            }
            if rank == 0:
                output = Path(self.output)
                output.parent.mkdir(parents=True, exist_ok=True)
                write_json_atomic(output, record)
            return record
        finally:
            if backend is not None:
                backend.close()
            release_process_group()
