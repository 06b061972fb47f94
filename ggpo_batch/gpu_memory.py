"""How much memory one GPU of an allocation needs to train a model: the formula preflight checks a
profile's `gpu_memory_gib` against, in one place.

GPU memory per GPU (bytes), for P parameters of b bytes each (dtype), N ranks (GPUs), ZeRO stage z:

    weights      P*b                       (z = 2: every rank holds them)   P*b/N (z = 3)
    gradients    P*b/N                     (partitioned at z = 2 and 3)
    optimizer    (12 if b < 4 else 8)*P/N  (fp32 master copy + Adam's two moments, partitioned)
    reference    P*b (z = 2)  P*b/N (z = 3) (train/reference.py: partitioned like the policy at z = 3)
    rollout      0 for the torch sampler at z = 2 (it samples from the policy module itself), P*b
                 at z = 3 (the policy's weights gathered while it rolls out, partitioned again
                 before the update: counted as if at once), or U*M for vLLM (its reservation: U =
                 vllm_gpu_memory_utilization of the GPU's M bytes)
    activations  R*T*H*L*(2 if gradient_checkpointing else 34)*b/2 + logits
                 (per layer 34*T*H bytes in 16 bit without recomputation, 2*T*H with it, after
                 Korthikanti et al. 2022, attention fused)
    logits       chunked (train/logprobs.py, C_t x C_v = logprob_chunk_tokens x logprob_chunk_vocab):
                 min(C_t, R*T)*min(C_v, V)*(12 + b) + R*T*H*(b + 4)   (one chunk's logits in dtype and
                 float32, a float32 temporary, its gradient; the gathered hidden states and their
                 float32 gradient: the formula of train/logprobs.py);
                 unchunked (C_t = 0): R*T*V*(b + 8) (logits in dtype plus float32 log-softmax)
    context      1 GiB (CUDA context, allocator slack)

with R rows per pass (train.micro_batch_size, else the rank's whole batch (prompts_per_step/N) x
group_size), T = max_model_len, H, L, V the checkpoint's hidden size, layers and vocabulary. The
sum must not exceed the profile's `gpu_memory_gib`. It is an estimate (no kernel workspace, no
fragmentation model); a spec that passes can still run out of memory, one that fails would.
"""

from __future__ import annotations

GIB = 1 << 30
CONTEXT_BYTES = GIB
ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN = {False: 34, True: 2}  # 16-bit, by gradient checkpointing


def memory_estimate(*, parameters: int, dtype_bytes: int, ranks: int, zero_stage: int, rows: int, seq_len: int,
                    hidden: int, layers: int, vocab: int, gradient_checkpointing: bool, rollout: str,
                    vllm_fraction: float, gpu_bytes: float, chunk_tokens: int = 0,
                    chunk_vocab: int = 0) -> dict[str, float]:
    """Bytes per GPU by part (the module docstring's formula); "total" is their sum."""
    p, b, n = parameters, dtype_bytes, ranks
    act = ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN[gradient_checkpointing]
    parts = {
        "weights": p * b / (n if zero_stage == 3 else 1),
        "gradients": p * b / n,
        "optimizer": (12 if b < 4 else 8) * p / n,
        "reference": p * b / (n if zero_stage == 3 else 1),
        "rollout": vllm_fraction * gpu_bytes if rollout == "vllm" else (p * b if zero_stage == 3 else 0.0),
        "activations": rows * seq_len * hidden * layers * act * b / 2,
        "logits": logits_bytes(rows * seq_len, hidden, vocab, b, chunk_tokens, chunk_vocab),
        "context": CONTEXT_BYTES,
    }
    parts["total"] = sum(parts.values())
    return parts


def logits_bytes(tokens: int, hidden: int, vocab: int, dtype_bytes: int, chunk_tokens: int, chunk_vocab: int) -> float:
    """Peak bytes of one pass's log-prob computation over `tokens` positions (the docstring's "logits")."""
    b = dtype_bytes
    if not chunk_tokens:
        return tokens * vocab * (b + 8)
    return min(chunk_tokens, tokens) * min(chunk_vocab or vocab, vocab) * (12 + b) + tokens * hidden * (b + 4)
