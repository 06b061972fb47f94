"""A vLLM engine driven one step at a time (`rollout.TurnEngine`), and the sampling parameters of a turn.

vLLM 0.32's request API, under the `LLM` of the backend: `llm_engine.add_request(id, prompt, params)`
queues a request without running it and `llm_engine.step()` runs one engine step (schedule, forward,
sample) and returns the requests it finished (`RequestOutputKind.FINAL_ONLY`). Colocated in a training rank (the
external launcher) the engine core runs in this process, so a step runs exactly when called and
sees exactly the requests added before it: the batch is a function of the calls, never of timing,
and the ranks of a tensor-parallel group, making the same calls, schedule and sample alike (per
request seeds; logits gathered over the group). A standalone engine (outside a job: tools, tests)
runs its core in a child process that steps on its own, so which requests share its batch there
depends on timing; each request's tokens do not (its seed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..task.codec import ByteCodec, Codec
from ..task.tokenizer import POLICY_TOKENS
from .sampler import Generation, TurnEngine


def sampling_params(codec: Codec, temperature: float, seed: int, max_tokens: int) -> Any:
    """One turn's `SamplingParams`: ended by the codec's stop ids (and stop strings, kept in the
    output, which need detokenized text), the behaviour log-prob of each sampled token after
    temperature and the allowed-token mask (the engine's `logprobs_mode`); the byte policy may not
    write the environment's tool tokens."""
    from vllm import SamplingParams

    allowed = {"allowed_token_ids": list(POLICY_TOKENS)} if isinstance(codec, ByteCodec) else {}
    strings = {"stop": list(codec.stop_strings), "include_stop_str_in_output": True} if codec.stop_strings else {}
    return SamplingParams(n=1, temperature=temperature, seed=seed, max_tokens=max_tokens, logprobs=0,
                          stop_token_ids=sorted(codec.stop_ids), detokenize=bool(codec.stop_strings),
                          skip_special_tokens=False, **allowed, **strings)


def generation(output: Any) -> Generation:
    """A finished `RequestOutput` as the sampled tokens and their behaviour log-probs."""
    c = output.outputs[0]
    toks = tuple(c.token_ids)
    return Generation(toks, tuple(float(lp[t].logprob) for t, lp in zip(toks, c.logprobs)))


class VllmTurns(TurnEngine):
    """`llm`'s engine as a TurnEngine; `group`: the gloo group of its tensor-parallel ranks (None: alone)."""

    def __init__(self, llm: Any, codec: Codec, temperature: float, group: Any = None) -> None:
        self.llm, self.codec, self.temperature, self.group = llm, codec, temperature, group
        self.keys: set[str] = set()  # the requests in flight (the caller's keys are their request ids)
        self.steps = 0

    def add(self, requests: Sequence[tuple[str, Sequence[int], int, int]]) -> None:
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        for key, prompt, max_new_tokens, seed in requests:
            params = sampling_params(self.codec, self.temperature, seed, max_new_tokens)
            params.output_kind = RequestOutputKind.FINAL_ONLY  # a step returns finished turns only
            self.llm.llm_engine.add_request(key, TokensPrompt(prompt_token_ids=list(prompt)), params)
            self.keys.add(key)

    def step(self) -> list[tuple[str, Generation]]:
        done = sorted(((o.request_id, generation(o)) for o in self.llm.llm_engine.step() if o.finished),
                      key=lambda kg: kg[0])
        self.keys.difference_update(key for key, _ in done)
        self.steps += 1
        if self.group is not None:
            self._check_step(done)
        return done

    def _check_step(self, done: list[tuple[str, Generation]]) -> None:
        """Raise at the first step whose finished turns differ between the group's ranks. Until a
        turn ends, ranks that drew other tokens still run alike-shaped batches; what they add next
        would differ (its prompt holds the turn), their schedulers would part and the engine's own
        collectives would wait on each other for ever. So the group compares each step's finished
        turns (a 63-bit hash, one all-gather of the gloo group: tens of microseconds) first."""
        digest = hashlib.blake2b(repr(done).encode(), digest_size=8).digest()
        mine = torch.tensor([int.from_bytes(digest, "big") >> 1], dtype=torch.int64)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(every, mine, group=self.group)
        if any(int(x) != int(mine) for x in every):
            raise RuntimeError(f"the ranks of a tensor-parallel vLLM engine finished different turns at engine step "
                               f"{self.steps} (their engines diverged): {[f'{int(x):016x}' for x in every]}")

    def busy(self) -> bool:
        return self.llm.llm_engine.has_unfinished_requests()

    def abort(self) -> None:
        """Drop the requests still in flight (an episode loop that failed leaves the engine clean)."""
        if self.keys:
            self.llm.llm_engine.abort_request(list(self.keys))
            self.keys.clear()

    def share(self, items: list[Any]) -> tuple[list[Any], int]:
        if self.group is None:
            return items, 0
        parts: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(parts, items, group=self.group)
        mine = dist.get_rank(self.group)
        return [x for part in parts for x in part], sum(len(part) for part in parts[:mine])

    def agree(self, digest: str) -> None:
        if self.group is None:
            return
        digests: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(digests, digest, group=self.group)
        if len(set(digests)) > 1:
            raise RuntimeError(f"the ranks of a tensor-parallel vLLM engine computed different episodes "
                               f"(digests {', '.join(d[:12] for d in digests)}): their engines diverged")
