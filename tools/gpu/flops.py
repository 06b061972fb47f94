"""The FLOP arithmetic of tools/gpu/flagship_check.py, pure (no torch): what a tokens/s figure is
worth in model FLOPs, what one training step computes, and the devices' peaks.

Two figures, each a count of FLOPs over the timed steps divided by their wall time and the peak:

- **MFU**, the standard definition (PaLM, Chowdhery et al. 2022, appendix B): 6N + 12·L·H·Q·T
  FLOPs per token of training, for the rows' real tokens (padding excluded). N = all parameters,
  tied embeddings counted once (= the non-embedding parameters plus the LM head, whose matmul
  every position runs in this definition; the input embedding lookup is no matmul). L layers, H
  query heads, Q the head dimension, T the row's own length: a row of T tokens counts
  T·(6N + 12·L·H·Q·T). Causal-mask convention: PaLM's, the whole T x T score and value matmuls,
  no halving for the mask (a causal kernel that skips the masked blocks does about half of that
  attention work). 6N + 12LHQT is 3 x the forward (the backward is twice the forward); it counts
  no recomputation and no other forward pass.
- **Step FLOP utilisation**: the FLOPs the step computes, every forward counted. One forward of a
  pass of r rows padded to w tokens, m of its targets under the loss:

      F = 2·N_body·r·w + 4·L·H·Q·r·w^2 + 2·D·V·m

  N_body = the non-embedding parameters (norm weights included, <0.01%: as if matmul weights),
  D the hidden size, V the vocabulary: padding is computed too, attention as above (full w x w,
  no causal halving), and the LM head only at the m positions under the loss (train/policy/
  logprobs.py's chunked log-probs). Per pass, the trainer (train/run/trainer.py `_update`) runs
  the policy's forward F and backward 2F; with gradient checkpointing the body's forward again
  in the backward (F - 2·D·V·m); with chunked log-probs the LM head's logits again in the
  backward (2·D·V·m); and each forward without grad it runs, F each: the reference's, and a
  separate forward of the old log-probs where one runs (none since issue 39: with one optimizer
  step a batch, old_logprobs = "policy" takes the update's own forward, detached). The optimizer
  step, the reference's refresh and the loss's elementwise work are not counted (O(N), not
  O(N·tokens)).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Dense (no sparsity) BF16 Tensor Core peaks, TFLOP/s, from NVIDIA's datasheets, which print the
# figure with 2:4 sparsity (halved here):
#   H100 SXM 1,979, H100 PCIe 1,513 (NVIDIA H100 Tensor Core GPU datasheet, 2023; the "H100 80GB
#   HBM3" that torch names is the SXM5 board), H100 NVL 1,671 (the same datasheet, per GPU, 2024
#   revision); H200 SXM 1,979, H200 NVL 1,671 (NVIDIA H200 Tensor Core GPU datasheet, 2024);
#   A100 SXM and PCIe, 40 and 80 GB, 624 (NVIDIA A100 Tensor Core GPU datasheet, 2021).
# Matched against torch.cuda.get_device_name() lower-cased: the first row whose words all occur.
PEAK_BF16_DENSE_TFLOPS: tuple[tuple[tuple[str, ...], str, float], ...] = (
    (("h200", "nvl"), "H200 NVL", 835.5),
    (("h200",), "H200 SXM", 989.5),
    (("h100", "nvl"), "H100 NVL", 835.5),
    (("h100", "pcie"), "H100 PCIe", 756.5),
    (("h100",), "H100 SXM", 989.5),
    (("a100",), "A100", 312.0),
)


def peak_for(device_name: str) -> tuple[str, float] | None:
    """(the datasheet's board, dense bf16 TFLOP/s) for a torch device name, or None when unknown."""
    name = device_name.lower()
    for words, board, tflops in PEAK_BF16_DENSE_TFLOPS:
        if all(w in name for w in words):
            return board, tflops
    return None


@dataclass(frozen=True)
class Shape:
    """What the FLOP counts read of a decoder-only model."""

    parameters: int  # all, tied embeddings once
    body_parameters: int  # non-embedding: all but the input embedding and the LM head
    layers: int
    heads: int  # query heads
    head_dim: int
    hidden: int
    vocab: int


@dataclass(frozen=True)
class PassShape:
    """One forward/backward pass as the trainer runs it: its rows' real lengths, the width they are
    padded to, and the targets under the loss (where the LM head runs)."""

    lengths: tuple[int, ...]
    width: int
    loss_tokens: int


@dataclass(frozen=True)
class Forwards:
    """Forwards a pass runs beside the policy's own with grad (always one, with its backward)."""

    old_logprobs: int = 0  # the policy without grad for the old log-probs (the trainer's take the update's own)
    reference: int = 1
    checkpointing: bool = True  # the body's forward recomputed in the backward
    chunked_head: bool = True  # the LM head's logits recomputed in the backward (Chunks.tokens > 0)


def model_flops(shape: Shape, lengths: Iterable[int]) -> int:
    """PaLM's training FLOPs of rows of these real lengths: sum of T·(6N + 12·L·H·Q·T)."""
    lhq = shape.layers * shape.heads * shape.head_dim
    return sum(t * (6 * shape.parameters + 12 * lhq * t) for t in lengths)


def body_forward_flops(shape: Shape, rows: int, width: int) -> int:
    """One forward of the layers over `rows` rows padded to `width` tokens (attention w x w)."""
    lhq = shape.layers * shape.heads * shape.head_dim
    return 2 * shape.body_parameters * rows * width + 4 * lhq * rows * width * width


def head_forward_flops(shape: Shape, loss_tokens: int) -> int:
    """The LM head's logits at the positions under the loss."""
    return 2 * shape.hidden * shape.vocab * loss_tokens


def pass_flops(shape: Shape, p: PassShape, forwards: Forwards) -> int:
    """What one pass computes (the module docstring's sum)."""
    body = body_forward_flops(shape, len(p.lengths), p.width)
    head = head_forward_flops(shape, p.loss_tokens)
    f = body + head
    return (3 * f + forwards.checkpointing * body + forwards.chunked_head * head
            + (forwards.old_logprobs + forwards.reference) * f)


def step_flops(shape: Shape, passes: Sequence[PassShape], forwards: Forwards) -> tuple[int, int]:
    """(model FLOPs by PaLM's definition, FLOPs computed) of a step of these passes."""
    return (model_flops(shape, (t for p in passes for t in p.lengths)),
            sum(pass_flops(shape, p, forwards) for p in passes))
