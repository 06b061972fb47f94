"""Rollout backends behind one small interface: the torch sampler here, vLLM in `vllm_backend`
(`backends.make_backend` chooses).

A backend samples one continuation per prompt from the *behaviour* policy and returns the tokens
with their log-probs; after each update the trainer pushes the new weights (`sync_weights`).
The same training loop drives every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .codec import ByteCodec, Codec


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # sampled tokens, the stop token included when one was sampled
    logprobs: tuple[float, ...]  # behaviour log-prob of each sampled token


class RolloutBackend(abc.ABC):
    """Samples continuations from the behaviour copy of the policy."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: int) -> list[Generation]:
        """One continuation per prompt, ending where the codec ends a turn (a stop token, a stop string)
        or after max_new_tokens (one limit for all, or one per prompt)."""

    @abc.abstractmethod
    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load the policy's current full weights into the behaviour copy."""

    def sleep(self) -> None:
        """Free accelerator memory during the update (vLLM); no-op where nothing is held."""

    def wake(self) -> None:
        """Undo `sleep` before the next rollouts."""

    def close(self) -> None:
        """Release the backend."""


class TorchSampler(RolloutBackend):
    """A hand-written batched sampler over an HF causal LM with a KV cache (left-padded prompts)."""

    def __init__(self, model: torch.nn.Module, codec: Codec | None = None) -> None:
        self.model = model.eval()
        self.codec = codec or ByteCodec()

    def sync_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        own = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: int) -> list[Generation]:
        if not prompts:
            return []
        codec = self.codec
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), codec.pad_id, dtype=torch.long, device=device)
        attn = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            attn[i, width - len(p):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        past, logits, next_pos = out.past_key_values, out.logits[:, -1], pos[:, -1] + 1
        stop = torch.tensor(sorted(codec.stop_ids), device=device)
        done = torch.tensor([n < 1 for n in limits], dtype=torch.bool, device=device)
        toks: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        for _ in range(max(limits)):
            if bool(done.all()):
                break
            logp = torch.log_softmax(codec.policy_logits(logits) / temperature, dim=-1)
            tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            done_now = done | torch.isin(tok, stop)
            for i in torch.nonzero(~done).flatten().tolist():
                toks[i].append(int(tok[i]))
                lps[i].append(float(lp[i]))
                if len(toks[i]) >= limits[i] or (codec.stop_strings and codec.turn_ended(toks[i])):
                    done_now[i] = True
            done = done_now
            if bool(done.all()):
                break
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                             past_key_values=past, use_cache=True)
            past, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
        return [Generation(tuple(t), tuple(l)) for t, l in zip(toks, lps)]
