"""GPU check 1: vLLM rollouts of a tiny policy follow pushed weights (sleep/wake included).

Prints the max |vLLM log-prob - policy log-prob| on vLLM's own samples before and after a weight
push, and the gap to the *old* weights after it; exits 1 if the update did not take effect.
"""

from __future__ import annotations

import sys
import time

import torch

from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import build_model, logprobs_of
from ggpo_batch.train.rollout.memory_order import free_cached_blocks, update_then_refill
from ggpo_batch.train.rollout.vllm_backend import VllmBackend
from ggpo_batch.train.task.tokenizer import encode

TOL_SAME = 0.08  # bf16 engine vs fp32 policy
TOL_MOVED = 0.5


def gap(model, prompts, gens) -> float:
    g = 0.0
    with torch.no_grad():
        for p, out in zip(prompts, gens):
            ids = torch.tensor([list(p) + list(out.tokens)], device="cuda")
            lp = logprobs_of(model, ids, torch.ones_like(ids), 1.0)[0, len(p) - 1 :].float().cpu()
            g = max(g, float((lp - torch.tensor(out.logprobs)).abs().max()))
    return g


def main() -> int:
    cfg = TrainConfig(n_embd=256, n_layer=4, n_head=4)
    old, new = build_model(cfg, 0).cuda(), build_model(cfg, 1).cuda()
    t = time.time()
    backend = VllmBackend(old, gpu_memory_utilization=0.2, seed=0, device_index=0)
    print(f"vLLM engine up in {time.time() - t:.1f}s")
    prompts = [encode(f"Question: what is item {i}?\nAnswer:") for i in range(64)]
    t = time.time()
    before = backend.generate(prompts, 32, 1.0, seed=1)
    n_tok = sum(len(g.tokens) for g in before)
    print(f"sampled {n_tok} tokens in {time.time() - t:.2f}s ({n_tok / (time.time() - t):.0f} tokens/s)")
    g_before = gap(old, prompts, before)
    # as around a DeepSpeed update (train/rollout/memory_order.py): sleep, free torch's cache, wake, push, wake
    update_then_refill(backend, lambda: None, lambda: backend.sync_weights({k: v.detach() for k, v in
                                                                            new.named_parameters()}),
                       free_cached_blocks(torch.device("cuda")))
    after = backend.generate(prompts, 32, 1.0, seed=1)
    g_new, g_old = gap(new, prompts, after), gap(old, prompts, after)
    print(f"logprob gap to the served policy before sync: {g_before:.4f}")
    print(f"after sync: gap to the NEW weights {g_new:.4f}, to the OLD weights {g_old:.4f}")
    backend.close()
    ok = g_before < TOL_SAME and g_new < TOL_SAME and g_old > TOL_MOVED
    print("WEIGHT SYNC OK" if ok else "WEIGHT SYNC FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
