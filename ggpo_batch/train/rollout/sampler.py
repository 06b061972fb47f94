"""Rollout backends behind one small interface: the torch sampler here, vLLM in `vllm_backend`
(`backends.make_backend` chooses).

A backend samples one continuation per prompt from the *behaviour* policy and returns the tokens
with their log-probs; after each update the trainer streams the new weights in (`sync_weights`) and
probes them (`prompt_logprobs`, train/weight_sync.py). The same training loop drives every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..task.codec import ByteCodec, Codec


@dataclass(frozen=True)
class Generation:
    tokens: tuple[int, ...]  # sampled tokens, the stop token included when one was sampled
    logprobs: tuple[float, ...]  # behaviour log-prob of each sampled token


Weights = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
Seeds = int | Sequence[int]  # one seed per prompt, or a base seed: prompt i gets base + i


def row_seeds(seed: Seeds, n: int) -> list[int]:
    """The sampling seed of each of `n` prompts."""
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    if len(seed) != n:
        raise ValueError(f"{len(seed)} seeds for {n} prompts")
    return list(seed)


def weight_items(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of a state dict or of a stream of them."""
    return weights.items() if isinstance(weights, Mapping) else weights


def sequence_logprobs(model: torch.nn.Module, tokens: Sequence[int], device: torch.device) -> list[float]:
    """Log-prob of each token after the first under `model`, at temperature 1 over the whole vocabulary
    (what vLLM's prompt log-probs are). Under ZeRO-3 a collective: every rank runs the forward."""
    ids = torch.tensor([list(tokens)], device=device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0, :-1]
    finally:
        model.train(training)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[0, 1:, None])[:, 0].cpu().tolist()


class RolloutBackend(abc.ABC):
    """Samples continuations from the behaviour copy of the policy."""

    # True when `generate` is a collective over a group of ranks (vLLM with tensor parallelism): every
    # rank of the group must call it as many times, with no prompts when it has none left.
    collective = False

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: Seeds) -> list[Generation]:
        """One continuation per prompt, ending where the codec ends a turn (a stop token, a stop string)
        or after max_new_tokens (one limit for all, or one per prompt). A prompt's tokens are a function
        of its own seed (`row_seeds`), not of the other prompts of the call."""

    def turn_engine(self, temperature: float) -> TurnEngine | None:
        """The engine driven step by step, where a trajectory's turns can join a running batch
        (`rollouts.run_episodes`); None: episodes go turn by turn through `generate`."""
        return None

    @abc.abstractmethod
    def sync_weights(self, weights: Weights) -> int:
        """Load the policy's current full weights into the behaviour copy, one tensor at a time as the
        stream yields them (a tensor may be freed once the next is asked for); returns how many."""

    def prompt_logprobs(self, tokens: Sequence[int]) -> list[float]:
        """Log-prob of each token after the first under the behaviour weights, at temperature 1 over the
        whole vocabulary (the weight-sync probe)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be probed after a weight push")

    def sleep(self) -> None:
        """Free accelerator memory during the update (vLLM); no-op where nothing is held."""

    def wake_weights(self) -> None:
        """Take the weights' memory back after `sleep`, before the push rewrites them."""

    def wake_kv_cache(self) -> None:
        """Take the KV cache's memory back after the push: the backend can generate again."""

    def close(self) -> None:
        """Release the backend."""


class TurnEngine(abc.ABC):
    """A rollout engine driven one engine step at a time: a request joins the running batch when it is
    added, and each step returns the turns it finished. Deterministic: the same requests added in the
    same order between the same steps give the same results, on every rank of a tensor-parallel group."""

    @abc.abstractmethod
    def add(self, requests: Sequence[tuple[str, Sequence[int], int, int]]) -> None:
        """Add (key, prompt, max_new_tokens, seed) requests, in this order."""

    @abc.abstractmethod
    def step(self) -> list[tuple[str, Generation]]:
        """Run one engine step; the turns it finished as (key, generation), ordered by key."""

    @abc.abstractmethod
    def busy(self) -> bool:
        """Whether any request added is unfinished."""

    def abort(self) -> None:
        """Drop every request still in flight (after a failure: the engine is left clean)."""

    def share(self, items: list[Any]) -> tuple[list[Any], int]:
        """The items of every rank of this engine's group, in rank order, and where this rank's begin
        (a collective over the group; alone: the items themselves, at 0)."""
        return items, 0

    def agree(self, digest: str) -> None:
        """Raise unless every rank of the group computed the same `digest` (a collective)."""


class TorchSampler(RolloutBackend):
    """A hand-written batched sampler over an HF causal LM with a KV cache (left-padded prompts)."""

    def __init__(self, model: torch.nn.Module, codec: Codec | None = None) -> None:
        self.model = model  # a behaviour copy, or the policy module itself (ZeRO-2: nothing to sync)
        self.codec = codec or ByteCodec()

    def sync_weights(self, weights: Weights) -> int:
        own = dict(self.model.named_parameters())
        n = 0
        with torch.no_grad():
            for name, tensor in weight_items(weights):
                own[name].copy_(tensor.to(own[name].dtype))
                n += 1
        return n

    def prompt_logprobs(self, tokens: Sequence[int]) -> list[float]:
        return sequence_logprobs(self.model, tokens, next(self.model.parameters()).device)

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                 seed: Seeds) -> list[Generation]:
        if not prompts:
            return []
        training = self.model.training  # a policy with gradient checkpointing trains in train mode
        self.model.eval()  # (HF turns the KV cache off in train mode under checkpointing)
        try:
            with torch.inference_mode():
                return self._generate(prompts, max_new_tokens, temperature, seed)
        finally:
            self.model.train(training)

    def _generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int], temperature: float,
                  seed: Seeds) -> list[Generation]:
        codec = self.codec
        limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
        device = next(self.model.parameters()).device
        # One generator a row: a row's k-th token is drawn from its own seed's k-th draw, whatever else
        # is in the batch (its logits equal across batches up to float rounding of the padded shapes).
        gens = [torch.Generator(device=device).manual_seed(s) for s in row_seeds(seed, len(prompts))]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), codec.pad_id, dtype=torch.long, device=device)
        # The attention mask of the whole call, preallocated: each decode step passes a longer view.
        full = torch.ones((len(prompts), width + max(limits)), dtype=torch.long, device=device)
        full[:, :width] = 0
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            full[i, width - len(p):] = 1
        attn = full[:, :width]
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        # Prefill: only the last position's logits are needed (the LM head over a prompt is not).
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
        past, logits, next_pos = out.past_key_values, out.logits[:, -1], pos[:, -1] + 1
        stop = torch.tensor(sorted(codec.stop_ids), device=device)
        done = torch.tensor([n < 1 for n in limits], dtype=torch.bool, device=device)
        toks: list[list[int]] = [[] for _ in prompts]
        lps: list[list[float]] = [[] for _ in prompts]
        for _ in range(max(limits)):
            if bool(done.all()):
                break
            logp = torch.log_softmax(codec.policy_logits(logits) / temperature, dim=-1)
            probs = logp.exp()
            going = torch.nonzero(~done).flatten().tolist()
            tok = torch.full((len(prompts),), codec.pad_id, dtype=torch.long, device=device)  # finished rows: a filler
            for i in going:
                tok[i] = torch.multinomial(probs[i], 1, generator=gens[i])[0]
            lp = logp.gather(-1, tok[:, None]).squeeze(-1)
            done_now = done | torch.isin(tok, stop)
            tok_l, lp_l = tok.tolist(), lp.tolist()
            for i in going:
                toks[i].append(tok_l[i])
                lps[i].append(lp_l[i])
                if len(toks[i]) >= limits[i] or (codec.stop_strings and codec.turn_ended(toks[i])):
                    done_now[i] = True
            done = done_now
            if bool(done.all()):
                break
            attn = full[:, : attn.shape[1] + 1]
            out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                             past_key_values=past, use_cache=True)
            past, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
        return [Generation(tuple(t), tuple(l)) for t, l in zip(toks, lps)]
