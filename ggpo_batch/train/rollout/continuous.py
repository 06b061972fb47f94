"""Episodes that continue on their own: continuous batching across turns.

Turn by turn (`environment.run_episodes`), every turn waits for the slowest trajectory of the batch
and the engine's batch empties behind it. Here each trajectory's turn is a request of its own: the
engine runs one step at a time (`rollout.TurnEngine`), and after each step the turns it finished
are recorded, their search calls are answered in one retrieval call, and their next turns are added
to the engine before its next step, while the other trajectories are still decoding.

Nothing that enters the engine's batch depends on timing: requests are added only between steps,
in key order, and the step's finished turns are handled in key order; retrieval runs in this thread.
So a rerun adds the same requests between the same steps, and so does every rank of a
tensor-parallel group: each rank runs the episodes of the whole group (`TurnEngine.share`: the same
trajectories in the same order), steps its engine as often as the others (a rank whose own
trajectories are done keeps stepping until the group's are), keeps its own share. The group
compares each engine step's finished turns (`vllm_turns`: a divergence fails at the step it
shows, before it could part the ranks' schedulers) and at the end the episodes (`TurnEngine.agree`).

Each turn carries its own seed (`environment.turn_seed`), so a trajectory gets the same tokens as
turn by turn, whatever else is in the batch (up to float rounding of the batch's shapes).
"""

from __future__ import annotations

import hashlib

from ..task.codec import ByteCodec, Codec
from ..task.retrieval import Retriever
from ..task.rewards import Rewards, score_trajectories
from .environment import Trajectory, record_tool_output, record_turn, trajectory_ids, turn_seed
from .environment import run_episodes as turn_by_turn
from .sampler import RolloutBackend, TurnEngine


def run_episodes(trajectories: list[Trajectory], backend: RolloutBackend, retriever: Retriever, *,
                 max_turns: int, max_new_tokens: int, temperature: float, top_k: int, passage_max_bytes: int,
                 seed: int, step: int = 0, codec: Codec | None = None,
                 rewards: Rewards | None = None) -> list[Trajectory]:
    """Roll every trajectory out to its answer and score it (`environment.run_episodes`'s contract):
    continuously where the backend has a step-wise engine, else turn by turn. Collective when the
    backend is: every rank of its group calls it, with or without trajectories."""
    codec = codec or ByteCodec()
    engine = backend.turn_engine(temperature)
    if engine is None:
        return turn_by_turn(trajectories, backend, retriever, max_turns=max_turns, max_new_tokens=max_new_tokens,
                            temperature=temperature, top_k=top_k, passage_max_bytes=passage_max_bytes, seed=seed,
                            codec=codec, step=step, rewards=rewards)
    every, first = engine.share(trajectories)
    try:
        _continue(every, engine, retriever, max_turns=max_turns, max_new_tokens=max_new_tokens, top_k=top_k,
                  passage_max_bytes=passage_max_bytes, seed=seed, step=step, codec=codec)
    except BaseException:
        engine.abort()
        raise
    if every is not trajectories:  # the group's copies: this rank's share back into its own objects
        engine.agree(episodes_digest(every))
        for mine, done in zip(trajectories, every[first:first + len(trajectories)]):
            mine.__dict__.update(done.__dict__)
    score_trajectories(trajectories, rewards)
    return trajectories


def _continue(every: list[Trajectory], engine: TurnEngine, retriever: Retriever, *, max_turns: int,
              max_new_tokens: int, top_k: int, passage_max_bytes: int, seed: int, step: int, codec: Codec) -> None:
    room = codec.max_model_len
    ids = trajectory_ids(every)
    width = len(str(max(len(every) - 1, 0)))

    def request(i: int, turn: int) -> tuple[str, list[int], int, int]:
        t = every[i]  # keys sort as (trajectory, turn): zero-padded
        return (f"{i:0{width}d}/{turn}", t.tokens, min(max_new_tokens, room - len(t.tokens)),
                turn_seed(seed, step, ids[i], turn))

    engine.add([request(i, 0) for i, t in enumerate(every) if len(t.tokens) < room])
    while engine.busy():
        asks = []
        for key, g in engine.step():
            i, turn = (int(x) for x in key.split("/"))
            query = record_turn(every[i], g.tokens, g.logprobs, codec, room=room, last=turn == max_turns - 1)
            if query is not None:
                asks.append((i, turn, query))
        if not asks:
            continue
        found = retriever.search_many([q for _, _, q in asks], top_k)  # the step's search calls, at once
        for (i, turn, _), passages in zip(asks, found):
            record_tool_output(every[i], passages, codec, passage_max_bytes=passage_max_bytes, room=room)
        engine.add([request(i, turn + 1) for i, turn, _ in asks])


def episodes_digest(trajectories: list[Trajectory]) -> str:
    """sha256 of the episodes' tokens, sources and behaviour log-probs (what a TP group must agree on)."""
    h = hashlib.sha256()
    for t in trajectories:
        h.update(repr((t.tokens, t.sources, t.behaviour_logprobs, t.turns)).encode())
    return h.hexdigest()
