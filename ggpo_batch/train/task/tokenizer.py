"""The byte-level vocabulary of the policy: 256 bytes, EOS and three tool tokens.

A vocabulary the project owns needs no download and makes the loss mask exact: tool output is
delimited by DOC_OPEN/DOC_CLOSE, which only the environment ever writes.
"""

from __future__ import annotations

EOS = 256  # ends the answer (and pads)
SEARCH = 257  # emitted by the policy: the turn's text is a search query; ends the turn
DOC_OPEN = 258  # written by the environment around each retrieved passage
DOC_CLOSE = 259
VOCAB_SIZE = 260
STOP_TOKENS = frozenset({EOS, SEARCH})
# Only the environment writes these: the policy's distribution excludes them, when sampling and
# when training alike, so a tool delimiter can never be a generated (loss-masked) token.
ENV_ONLY_TOKENS = (DOC_OPEN, DOC_CLOSE)
POLICY_TOKENS = tuple(i for i in range(VOCAB_SIZE) if i not in ENV_ONLY_TOKENS)


def policy_logits(logits):
    """`logits` [..., VOCAB_SIZE] with the environment-only tokens made impossible."""
    logits = logits.float().clone()
    logits[..., list(ENV_ONLY_TOKENS)] = float("-inf")
    return logits


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def decode(ids: list[int]) -> str:
    """Text of the byte tokens; special tokens are dropped."""
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")
