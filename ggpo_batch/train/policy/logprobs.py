"""The policy's (and the reference's) log-probs of the tokens under the loss, computed in chunks.

The plain way, `model(...).logits` then a log-softmax, materialises [rows, tokens, vocabulary]
logits in the model dtype, a float32 copy, a masked clone and the float32 log-softmax, and autograd
keeps them for the backward pass: at a 150k vocabulary that alone outgrows a GPU. Here the base
model gives the final hidden states; only the positions under the loss mask go on; the LM head is
applied to `chunk_tokens` of them at a time against `chunk_vocab` rows of its weight at a time,
with a running logsumexp over the vocabulary chunks; the backward pass recomputes each chunk's
logits (nothing of vocabulary size is saved). Same semantics as `model.policy_token_logprobs`:
environment-only tokens impossible (the codec's `env_only_ids`), logits divided by the temperature.

Peak memory of the log-prob part of one pass (bytes), N = masked target tokens of the pass, H the
hidden size, V the vocabulary, b the dtype's bytes, C_t x C_v the chunk:

    unchunked  N' * V * (b + 4 + 4 + 4)     N' = rows x (tokens from the first masked column):
                                            logits, float32 copy, masked clone, log-softmax (kept
                                            for backward), and as much again for their gradient
    chunked    C_t * C_v * (12 + b)         one chunk's logits out of the matmul (dtype), in float32
                                            (softmax and gradient computed over them in place), a
                                            float32 temporary of logsumexp, the gradient in dtype;
             + N * H * (b + 4)              the gathered hidden states and their float32 gradient
             + V * H * b                    the LM head weight's gradient (which the unchunked
                                            backward produces too)

so the chunked figure does not grow with rows x tokens x vocabulary. Under ZeRO-3 the LM head's
weight is partitioned: it is only read inside a call of the head module (`redirect`), where
DeepSpeed's hooks have gathered it, forward and backward alike; tied embeddings are one
parameter and take the same path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..task.codec import ByteCodec, Codec

BYTE_CODEC = ByteCodec()
# Config attributes of architectures whose logits are not plain `lm_head(hidden)`.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale", "logits_scaling")


@dataclass(frozen=True)
class Chunks:
    """How the log-probs are computed: `tokens` 0 is the unchunked reference path (full logits);
    else `tokens` masked positions x `vocab` vocabulary rows of the LM head at a time."""

    tokens: int = 1024
    vocab: int = 8192


def redirect(call: Callable[..., Any], module: torch.nn.Module, fn: Callable[..., Any], *args: Any,
             **kwargs: Any) -> Any:
    """`call(*args, **kwargs)` with `module.forward` replaced by `fn` for that one call. `call` is the
    module itself or the DeepSpeed engine wrapping it: either way the module's own hooks run around
    `fn` (ZeRO-3 gathers the module's parameters before it and releases them after; in backward it
    gathers them again), which calling `fn` directly would skip."""
    own = module.__dict__.get("forward")

    def once(*a: Any, **k: Any) -> Any:
        _restore(module, own)
        return fn(*a, **k)

    module.forward = once  # type: ignore[method-assign]
    try:
        return call(*args, **kwargs)
    finally:
        _restore(module, own)


def _restore(module: torch.nn.Module, own: Any) -> None:
    if own is not None:
        module.forward = own  # type: ignore[method-assign]
    else:
        module.__dict__.pop("forward", None)


def _logits(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, v0: int, v1: int,
            banned: torch.Tensor, temperature: float) -> torch.Tensor:
    """Tempered float32 logits of vocabulary rows v0:v1, banned ids -inf (as Codec.policy_logits)."""
    z = F.linear(h, weight[v0:v1], None if bias is None else bias[v0:v1]).float()
    inside = banned[(banned >= v0) & (banned < v1)] - v0
    if inside.numel():
        z[:, inside] = float("-inf")
    return z.div_(temperature)  # in place: one chunk-sized float32 tensor, not two


class _HeadLogprobs(torch.autograd.Function):
    """log_softmax(policy_logits(hidden @ weight.T + bias) / temperature)[target], chunk by chunk."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, banned: torch.Tensor, temperature: float, ct: int, cv: int) -> torch.Tensor:
        n, vocab = hidden.shape[0], weight.shape[0]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        picked = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for s in range(0, n, ct):
            h, t = hidden[s:s + ct], targets[s:s + ct]
            run = torch.full((h.shape[0],), float("-inf"), device=hidden.device)
            tl = run.clone()
            for v0 in range(0, vocab, cv):
                v1 = min(v0 + cv, vocab)
                z = _logits(h, weight, bias, v0, v1, banned, temperature)
                run = torch.logaddexp(run, torch.logsumexp(z, dim=1))
                inside = (t >= v0) & (t < v1)
                tl = torch.where(inside, z.gather(1, (t - v0).clamp(0, v1 - v0 - 1)[:, None]).squeeze(1), tl)
            lse[s:s + ct], picked[s:s + ct] = run, tl
        ctx.save_for_backward(hidden, weight, bias, targets, banned, lse)
        ctx.temperature, ctx.ct, ctx.cv = temperature, ct, cv
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, banned, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n, vocab, ct, cv = hidden.shape[0], weight.shape[0], ctx.ct, ctx.cv
        grad = grad.float()
        gh = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        gw = torch.zeros_like(weight) if need_w else None
        gb = torch.zeros_like(bias) if need_b and bias is not None else None
        # Vocabulary outer: the weight's gradient is summed in float32 one vocabulary chunk at a time.
        for v0 in range(0, vocab, cv):
            v1 = min(v0 + cv, vocab)
            gw_c = torch.zeros((v1 - v0, weight.shape[1]), dtype=torch.float32, device=weight.device) if need_w else None
            gb_c = torch.zeros(v1 - v0, dtype=torch.float32, device=weight.device) if gb is not None else None
            for s in range(0, n, ct):
                h, t, g = hidden[s:s + ct], targets[s:s + ct], grad[s:s + ct]
                z = _logits(h, weight, bias, v0, v1, banned, ctx.temperature)
                # d(z_t - lse)/dz = onehot(t) - softmax(z); banned entries have softmax 0 and no gradient.
                dz = z.sub_(lse[s:s + ct, None]).exp_().mul_(-g[:, None])  # in place, over z
                rows = torch.nonzero((t >= v0) & (t < v1)).flatten()
                dz[rows, t[rows] - v0] += g[rows]
                dz = dz.div_(ctx.temperature).to(weight.dtype)
                if gh is not None:
                    gh[s:s + ct] += (dz @ weight[v0:v1]).float()
                if gw_c is not None:
                    gw_c += (dz.t() @ h).float()
                if gb_c is not None:
                    gb_c += dz.float().sum(0)
            if gw is not None:
                gw[v0:v1] = gw_c.to(weight.dtype)
            if gb is not None:
                gb[v0:v1] = gb_c.to(bias.dtype)
        return (gh.to(hidden.dtype) if gh is not None else None, gw, gb, None, None, None, None, None)


def head_logprobs(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                  banned: Sequence[int], chunks: Chunks) -> torch.Tensor:
    """Log-probs [N] of `targets` [N] from final hidden states [N, H] through the LM head `head`
    (an nn.Linear), called through the module so that ZeRO-3 gathers its weight."""
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"chunked log-probs need a Linear LM head, this model has {type(head).__name__}; "
                        f"set train.logprob_chunk_tokens = 0")
    ban = torch.tensor(list(banned), dtype=torch.long, device=hidden.device)

    def fn(h: torch.Tensor) -> torch.Tensor:
        return _HeadLogprobs.apply(h, head.weight, head.bias, targets, ban, temperature, chunks.tokens, chunks.vocab)

    return redirect(head, head, fn, hidden)


def masked_logprobs(call: Callable[..., Any], model: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, mask: torch.Tensor, temperature: float, codec: Codec | None,
                    chunks: Chunks) -> torch.Tensor:
    """Log-probs [B, T-1] of input_ids[:, 1:] under `model`, float32, 0 wherever `mask` [B, T-1] is
    False (those targets may be impossible tool tokens: no -inf reaches a sum). `call` is `model` or
    the DeepSpeed engine wrapping it."""
    codec = codec or BYTE_CODEC
    if not chunks.tokens:
        return _unchunked(call, input_ids, attention_mask, mask, temperature, codec)
    for key in LOGIT_TRANSFORMS:
        if getattr(model.config, key, None):
            raise ValueError(f"{type(model).__name__} transforms its logits ({key}): chunked log-probs would differ; "
                             f"set train.logprob_chunk_tokens = 0")
    head, base = model.get_output_embeddings(), model.base_model
    banned = tuple(codec.env_only_ids)

    def fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        picked = head_logprobs(head, hidden[:, :-1][mask], input_ids[:, 1:][mask], temperature, banned, chunks)
        return torch.zeros(mask.shape, dtype=torch.float32, device=picked.device).masked_scatter(mask, picked)

    return redirect(call, model, fn, input_ids=input_ids, attention_mask=attention_mask)


def _unchunked(call: Callable[..., Any], input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
               temperature: float, codec: Codec) -> torch.Tensor:
    """The full-logits path (the reference the chunked one is tested against): logits only from the
    first column any row trains on, since prompts carry no loss."""
    from .ggpo import token_logprobs

    cols = torch.nonzero(mask.any(dim=0)).flatten()
    first = int(cols[0]) if cols.numel() else mask.shape[1] - 1
    logits = call(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                  logits_to_keep=mask.shape[1] - first + 1).logits[:, :-1]
    logp = token_logprobs(codec.policy_logits(logits) / temperature, input_ids[:, first + 1:])
    logp = torch.where(mask[:, first:], logp, 0.0)
    return torch.cat([logp.new_zeros(mask.shape[0], first), logp], dim=1)
