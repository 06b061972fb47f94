"""BytePolicy: the tiny byte-level causal policy of the nightly tier, with its sampler and NLL.

257 tokens (256 byte values and EOS). The hidden state at position t is the running mean of the
token embeddings up to t plus an embedding of token t, layer-normed, then a linear head: causal by
construction, no attention, small enough that a full tier runs in seconds on two cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

VOCAB = 257
EOS = 256


@dataclass(frozen=True)
class PolicyConfig:
    width: int = 24
    vocab: int = VOCAB

    def describe(self) -> str:
        return f"{self.vocab}-token causal cumulative-embedding BytePolicy, width{self.width}"


class BytePolicy(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.config = config
        self.prefix = nn.Embedding(config.vocab, config.width)
        self.current = nn.Embedding(config.vocab, config.width)
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab)
        self.sampled_tokens = 0  # counted by `sample`: proves which model generated (online) rollouts

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> next-token logits [B, T, V]; position t sees only ids[:, :t+1]."""
        counts = torch.arange(1, ids.shape[1] + 1, device=ids.device, dtype=torch.float32)[None, :, None]
        running_mean = self.prefix(ids).cumsum(dim=1) / counts
        return self.head(self.norm(running_mean + self.current(ids)))


def flat_parameters(model: nn.Module) -> torch.Tensor:
    """All parameters as one detached fp32 vector (a snapshot: later updates do not change it)."""
    return torch.cat([p.detach().reshape(-1).float().clone() for p in model.parameters()])


def parameter_delta_l2(model: nn.Module, before: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(flat_parameters(model) - before).item())


def nll(model: BytePolicy, chunks: torch.Tensor) -> float:
    """Mean next-byte negative log-likelihood (nats) over chunks [n, L]: predicts bytes 1..L-1."""
    with torch.no_grad():
        logits = model(chunks[:, :-1])
        return float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunks[:, 1:].reshape(-1)).item())


@dataclass(frozen=True)
class Rollouts:
    """G sampled continuations of one prompt, right-padded with EOS after the first EOS."""

    prompt: torch.Tensor  # [P]
    tokens: torch.Tensor  # [G, max_new]
    lengths: torch.Tensor  # [G] generated tokens, EOS included when sampled
    natural_eos: torch.Tensor  # [G] bool: stopped by sampling EOS, not by max_new

    @property
    def generated_tokens(self) -> int:
        return int(self.lengths.sum().item())


def sample(model: BytePolicy, prompt: torch.Tensor, n: int, max_new: int, gen: torch.Generator,
           temperature: float = 1.0) -> Rollouts:
    """Sample n continuations of `prompt` (token by token, temperature sampling) from `model`."""
    seqs = prompt[None, :].repeat(n, 1)
    done = torch.zeros(n, dtype=torch.bool)
    lengths = torch.zeros(n, dtype=torch.int64)
    out = torch.full((n, max_new), EOS, dtype=torch.int64)
    with torch.no_grad():
        for t in range(max_new):
            logits = model(seqs)[:, -1, :] / temperature
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, EOS), nxt)
            out[:, t] = nxt
            lengths += (~done).to(torch.int64)
            done = done | (nxt == EOS)
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
            if bool(done.all()):
                break
    model.sampled_tokens += int(lengths.sum().item())
    # lengths >= 1 always; the rollout stopped naturally when its last generated token is EOS
    natural = out.gather(1, (lengths - 1)[:, None]).squeeze(1) == EOS
    return Rollouts(prompt=prompt, tokens=out, lengths=lengths, natural_eos=natural)
