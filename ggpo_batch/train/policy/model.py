"""The policy network: a pretrained checkpoint (`[train.model]`, through `hf`) or the built-in GPT-2
built from config over the byte vocabulary (no download)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from ..config import TrainConfig
from ..task.codec import ByteCodec, Codec
from ..task.tokenizer import EOS, VOCAB_SIZE

BYTE_CODEC = ByteCodec()


def model_config(cfg: TrainConfig) -> GPT2Config:
    # Dropout off: behaviour, policy and reference log-probs must agree on identical weights.
    return GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=cfg.n_positions, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=EOS,
        eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=True,
    )


def build_model(cfg: TrainConfig, seed: int) -> GPT2LMHeadModel:
    """The built-in initial policy; every rank builds the identical one from the same seed."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(model_config(cfg))
    model.eval()
    return model


def initial_policy(cfg: TrainConfig, seed: int, model_dir: Path | None = None) -> torch.nn.Module:
    """The policy a run starts from: the checkpoint of `[train.model]` (resolved to `model_dir`), else
    the built-in GPT-2 from `seed`."""
    if cfg.model is None:
        return build_model(cfg, seed)
    from ..pretrained.hf import load_model, resolve

    return load_model(model_dir or resolve(cfg.model.path), dtype=cfg.model.dtype,
                      attn_implementation=cfg.model.attn_implementation,
                      gradient_checkpointing=cfg.model.gradient_checkpointing)


def named_full_parameters(module: torch.nn.Module, zero_stage: int) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of every parameter, gathering ZeRO-3 partitions one at a time (collective)."""
    if zero_stage < 3:
        for name, p in module.named_parameters():
            yield name, p.detach()
        return
    import deepspeed

    for name, p in module.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            yield name, p.detach().clone()


def full_state_dict(module: torch.nn.Module, zero_stage: int) -> dict[str, torch.Tensor]:
    """Every parameter as a float32 host copy (tests compare weights with it; the export does not)."""
    return {n: t.float().cpu().clone() for n, t in named_full_parameters(module, zero_stage)}


def update_digest(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """Feed one tensor into `digest` (a hashlib object): its name, dtype and shape, then its bytes as
    they are held (no conversion), read in place from a host tensor: nothing the size of the model is
    built, only the one tensor's host copy when it lives on a GPU."""
    host = tensor.detach().cpu().contiguous()
    digest.update(f"{name}\0{str(host.dtype).removeprefix('torch.')}\0{tuple(host.shape)}\0".encode())
    digest.update(host.reshape(-1).view(torch.uint8).numpy())


def logprobs_of(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                temperature: float, codec: Codec | None = None) -> torch.Tensor:
    """Log-probs [B, T-1] of input_ids[:, 1:] under `model` (right-padded batch)."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return policy_token_logprobs(out.logits[:, :-1], input_ids[:, 1:], temperature, codec)


def policy_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float,
                          codec: Codec | None = None) -> torch.Tensor:
    """Log-probs of targets under the policy's sampling distribution (tempered, env-only tokens removed);
    `codec` None is the byte vocabulary's."""
    from .ggpo import token_logprobs

    return token_logprobs((codec or BYTE_CODEC).policy_logits(logits) / temperature, targets)
