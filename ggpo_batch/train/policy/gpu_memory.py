"""How much memory one GPU of an allocation needs to train a model: the formula preflight checks a
profile's `gpu_memory_gib` against, in one place.

GPU memory per GPU (bytes), for P parameters of b bytes each (dtype), N ranks (GPUs), ZeRO stage z,
R rows per pass (train.micro_batch_size, else the rank's whole batch (prompts_per_step/N) x
group_size), T = max_model_len (R*T: a pass's tokens, at most train.max_tokens_per_pass where that
is set, but never less than one row: train/passes.py `pass_tokens`), H, L, V the checkpoint's
hidden size, layers and vocabulary. Every
term is in `memory_estimate`'s result, in this order, each with its source in a comment there:

    weights           P*b (z = 2: every rank holds them), P*b/N (z = 3)
    gradients         4*P/N (the rank's partition, accumulated in float32: data_types.grad_accum_dtype)
    fp32_gradients    4*reduce_bucket_size when b < 4: a bucket cast to float32 for its reduction
                      (communication_data_type); the step's cast of the float32 partition is itself
    optimizer         (12 if b < 4 else 8)*P/N: fp32 master copy + Adam's two moments, partitioned
    adam_step         4*P/N: torch's foreach AdamW's temporary sqrt of the second moment
    reduce_bucket     reduce_bucket_size*b (x 2 with overlap_comm): ZeRO's gradient staging buffer
    allgather_bucket  0 at z = 2 (updated partitions are gathered in place); z = 3: the prefetch bucket
    reference         P*b (z = 2), P*b/N (z = 3: partitioned like the policy, train/reference.py)
    rollout           torch sampler: 0 at z = 2 (it samples from the policy module), P*b at z = 3 (the
                      weights gathered while it rolls out); vLLM: U*M (its reservation: U =
                      vllm_gpu_memory_utilization of the GPU's M bytes)
    activations       R*T*H*L*(2 if gradient_checkpointing else 34)*b/2
    recomputed_layer  R*T*H*34*b/2 with gradient checkpointing: one layer recomputed for its backward
    logits            the log-prob computation (train/logprobs.py): chunked C_t x C_v =
                      logprob_chunk_tokens x logprob_chunk_vocab: min(C_t, R*T)*min(C_v, V)*(12 + b) +
                      R*T*H*(b + 4); unchunked (C_t = 0): R*T*V*(b + 8)
    lm_head_gradient  V*H*b, + min(C_v, V)*H*4 chunked (the float32 sum of one vocabulary chunk)
    cuda_context      1.8 GiB: CUDA context, cuBLAS/cuDNN workspaces, loaded kernels
    nccl              1.8 GiB per NCCL communicator: 2 (torch's world group and DeepSpeed's clone of
                      it), + 1 for a vLLM engine with tensor_parallel_size > 1
    allocator_slack   1 GiB: blocks the caching allocator holds but cannot reuse

(Korthikanti et al. 2022 for the activations: 34*T*H bytes per layer in 16 bit without
recomputation, attention fused; 2*T*H, the layer's input, with it.) For the flagship
(Qwen3-1.7B-class, bf16, ZeRO-2 on 4 GPUs) the last three come to 6.4 GiB. The sum must not exceed
the profile's `gpu_memory_gib`. It is an estimate that adds terms which peak at different moments
(the optimizer step's after the backward pass's), with no model of fragmentation: a spec that passes
can still run out of memory, one that fails would be close to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .passes import pass_tokens, rows_per_pass

if TYPE_CHECKING:
    from ..config import TrainConfig

GIB = 1 << 30
ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN = {False: 34, True: 2}  # 16-bit, by gradient checkpointing
# ZeRO's communication on a GPU, which the policy engine's config (train/engine_config.py) sets
# through `zero_communication`: gradients are reduced on a side stream while the backward pass goes
# on (overlap_comm, on at both stages), in
# buckets of 2e8 elements (Hugging Face transformers' ZeRO-2 configuration, tests/deepspeed/
# ds_config_zero2.json: allgather and reduce buckets 2e8 with overlap_comm) rather than DeepSpeed's
# 5e8 default: with overlap_comm ZeRO-2 keeps two reduce buckets, and a smaller one starts reducing
# earlier in the backward pass. DeepSpeed's other defaults (deepspeed/runtime/zero/
# config.py: stage3_prefetch_bucket_size 5e7, sub_group_size 1e9) stay. On the CPU (gloo) the
# engine keeps DeepSpeed's defaults: 5e8, overlap off at stage 2 (tests/train/hf/
# test_gpu_memory_terms.py reads both back from engines).
REDUCE_BUCKET_ELEMENTS = 200_000_000
ALLGATHER_BUCKET_ELEMENTS = 200_000_000
PREFETCH_BUCKET_ELEMENTS = 50_000_000
SUB_GROUP_ELEMENTS = 1_000_000_000
OVERLAP_COMM = True
# Gradients accumulate over a step's passes and are reduced over the ranks in float32, whatever the
# model's dtype (engine_config.py: DeepSpeed's data_types.grad_accum_dtype and communication_data_type).
GRAD_ACCUM_DTYPE = COMMUNICATION_DTYPE = "fp32"
GRADIENT_BYTES = 4


def zero_communication(gpu: bool) -> dict[str, object]:
    """The `zero_optimization` entries the trainer adds to the stage's own on a GPU (the values above);
    none on the CPU."""
    if not gpu:
        return {}
    return {"overlap_comm": OVERLAP_COMM, "contiguous_gradients": True,
            "reduce_bucket_size": REDUCE_BUCKET_ELEMENTS, "allgather_bucket_size": ALLGATHER_BUCKET_ELEMENTS}


# Measured by vLLM on one 80 GB H100 (vllm-project/vllm#10511, its profiler's sanity check):
# non-torch memory 1.79 GiB for one process at tensor_parallel_size 1 (CUDA context, cuBLAS/cuDNN
# workspaces, kernels), 3.58 GiB at 2 (one NCCL communicator more). PyTorch's own CUDA context alone
# is 0.29 GB with lazy module loading, 0.67 GB without (pytorch/pytorch#86509); NCCL measured 0.69 GB
# for one 4-GPU communicator on A100s (NVIDIA/nccl#964) and ~1.6 GB on another machine
# (NVIDIA/nccl#864): memory grows with the channels, which H100/H200 NVLink uses more of.
CUDA_CONTEXT_BYTES = int(1.8 * GIB)
NCCL_COMMUNICATOR_BYTES = int(1.8 * GIB)
# torch's default process group, and DeepSpeed's clone of the world group that ZeRO reduces over
# (deepspeed/utils/groups.py `_clone_world_group`: a new_group, hence its own communicator).
TRAINER_COMMUNICATORS = 2
# Cached blocks the allocator keeps reserved but cannot place the next tensor in (reserved >
# allocated: PyTorch's "CUDA memory management" notes). A margin, not a measurement: the 1 GiB this
# formula always had.
ALLOCATOR_SLACK_BYTES = GIB


def memory_estimate(*, parameters: int, dtype_bytes: int, ranks: int, zero_stage: int, rows: int, seq_len: int,
                    hidden: int, layers: int, vocab: int, gradient_checkpointing: bool, rollout: str,
                    vllm_fraction: float, gpu_bytes: float, chunk_tokens: int = 0, chunk_vocab: int = 0,
                    tensor_parallel_size: int = 1, tokens: int | None = None) -> dict[str, float]:
    """Bytes per GPU by term (the module docstring's formula, in its order); "total" is their sum.
    `tokens`: the most tokens one pass holds, where a token budget packs passes (train/passes.py
    `pass_tokens`); default R*T."""
    p, b, n, z = parameters, dtype_bytes, ranks, zero_stage
    act = ACTIVATION_BYTES_PER_LAYER_TOKEN_HIDDEN[gradient_checkpointing]
    tokens = rows * seq_len if tokens is None else tokens
    # The fp32 partition ZeRO-3 steps at a time is at most one sub-group (stage3.py's sub_group_size).
    stepped = min(p / n, SUB_GROUP_ELEMENTS) if z == 3 else p / n
    parts = {
        "weights": p * b / (n if z == 3 else 1),
        # engine_config.py accumulates in float32 (data_types.grad_accum_dtype): stage_1_and_2.py
        # `_build_compact_grad_partition_buffer` (stage3.py the same) keeps the rank's partition of the
        # gradients in float32 across the passes; `step`'s `flat_grad_partition.to(fp32)` returns it.
        "gradients": GRADIENT_BYTES * p / n,
        # communication_data_type float32: stage_1_and_2.py `gradient_reduction_w_predivide` (stage3.py
        # `__avg_scatter_contiguous_grads`) reduces a float32 copy of the low-precision bucket, one at a time.
        "fp32_gradients": REDUCE_BUCKET_ELEMENTS * GRADIENT_BYTES if b < GRADIENT_BYTES else 0.0,
        "optimizer": (12 if b < 4 else 8) * p / n,
        # The trainer's optimizer is torch's AdamW (`torch_adam: true`), foreach on GPU:
        # torch/optim/adam.py `_multi_tensor_adam` allocates `exp_avg_sq_sqrt = _foreach_sqrt(...)`,
        # float32, the size of the stepped partition.
        "adam_step": 4 * stepped,
        # stage_1_and_2.py `setup_buckets`: contiguous_gradients (on by default) stages gradients in
        # buffers of reduce_bucket_size elements in the model dtype, a second one with overlap_comm;
        # stage3.py allocates one such bucket.
        "reduce_bucket": REDUCE_BUCKET_ELEMENTS * b * (2 if z == 2 and OVERLAP_COMM else 1),
        # deepspeed/runtime/utils.py `all_gather_dp_groups`: with all_gather_into_tensor (NCCL) the
        # updated partitions are gathered into the flat bit16 buffer the weights live in: nothing new
        # (allgather_bucket_size only shards the older path, over views). Stage 3 gathers parameters
        # ahead of use: its prefetch bucket.
        "allgather_bucket": PREFETCH_BUCKET_ELEMENTS * b if z == 3 else 0.0,
        "reference": p * b / (n if z == 3 else 1),
        "rollout": vllm_fraction * gpu_bytes if rollout == "vllm" else (p * b if z == 3 else 0.0),
        "activations": tokens * hidden * layers * act * b / 2,
        # With checkpointing each layer's forward runs again in the backward pass and holds its whole
        # activations (Korthikanti et al. 2022, 34*T*H bytes in 16 bit) until its gradients are out.
        "recomputed_layer": tokens * hidden * 34 * b / 2 if gradient_checkpointing else 0.0,
        "logits": logits_bytes(tokens, hidden, vocab, b, chunk_tokens, chunk_vocab),
        # train/logprobs.py's backward: the LM head weight's gradient, whole (tied embeddings: one
        # parameter), and the float32 sum of one vocabulary chunk of it.
        "lm_head_gradient": vocab * hidden * b + (min(chunk_vocab or vocab, vocab) * hidden * 4 if chunk_tokens else 0),
        "cuda_context": CUDA_CONTEXT_BYTES,
        "nccl": NCCL_COMMUNICATOR_BYTES * (TRAINER_COMMUNICATORS + (1 if rollout == "vllm" and
                                                                    tensor_parallel_size > 1 else 0)),
        "allocator_slack": ALLOCATOR_SLACK_BYTES,
    }
    parts["total"] = sum(parts.values())
    return parts


def logits_bytes(tokens: int, hidden: int, vocab: int, dtype_bytes: int, chunk_tokens: int, chunk_vocab: int) -> float:
    """Peak bytes of one pass's log-prob computation over `tokens` positions (the docstring's "logits")."""
    b = dtype_bytes
    if not chunk_tokens:
        return tokens * vocab * (b + 8)
    return min(chunk_tokens, tokens) * min(chunk_vocab or vocab, vocab) * (12 + b) + tokens * hidden * (b + 4)


def breakdown(gib: Mapping[str, float], gpu_gib: float) -> list[str]:
    """The estimate's terms in GiB (preflight's `gpu_memory_estimate_gib`) as lines for a person: every
    term, then the total against one GPU's `gpu_gib`."""
    width = max(len(k) for k in gib)
    lines = [f"  {k:<{width}} {v:7.2f} GiB" for k, v in gib.items() if k != "total"]
    verdict = "fits" if gib["total"] <= gpu_gib else "does NOT fit"
    lines.append(f"  {'total':<{width}} {gib['total']:7.2f} GiB of {gpu_gib:g} GiB per GPU: {verdict}")
    return lines


def memory_parts(cfg: TrainConfig, model: Mapping[str, Any], ranks: int, gpu_bytes: float,
                 seq_len: int | None = None) -> dict[str, float]:
    """memory_estimate of `cfg` on a model of shape `model` (parameters, dtype_bytes,
    hidden, layers, vocab) at `seq_len` tokens (default: the config's max_model_len)."""
    return memory_estimate(
        parameters=model["parameters"], dtype_bytes=model["dtype_bytes"], ranks=ranks, zero_stage=cfg.zero_stage,
        rows=rows_per_pass(cfg, ranks), seq_len=seq_len or cfg.max_model_len,
        tokens=pass_tokens(cfg, ranks, seq_len), hidden=model["hidden"],
        layers=model["layers"], vocab=model["vocab"],
        gradient_checkpointing=bool(cfg.model and cfg.model.gradient_checkpointing), rollout=cfg.rollout,
        vllm_fraction=cfg.vllm_gpu_memory_utilization, gpu_bytes=gpu_bytes, chunk_tokens=cfg.logprob_chunk_tokens,
        chunk_vocab=cfg.logprob_chunk_vocab, tensor_parallel_size=cfg.tensor_parallel_size)
