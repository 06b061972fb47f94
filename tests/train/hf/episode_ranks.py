"""One rank of the continuous-episode check (tests/train/hf/test_hf_episodes.py): gloo, then a vLLM
engine inside this process (external launcher, tensor parallelism `tp`) serving a checkpoint whose
episodes have a known shape (tiny_hf.set_turn_lengths: short search calls, answers of very different
lengths). Writes what it saw to `<out>.rank<N>.json`.

Rank r rolls out 6 - 3r trajectories numbered as the trainer numbers them (ids unique in the step),
so the ranks of a group ask for different numbers of episodes and one runs out of its own first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def record(trajs: list) -> dict:  # type: ignore[type-arg]
    return {str(t.uid): {"tokens": t.tokens, "sources": t.sources, "logprobs": t.behaviour_logprobs,
                         "turns": [[off, list(toks)] for off, toks in t.turns], "answer": t.answer,
                         "reward": t.reward, "titles": t.retrieved_titles, "calls": t.calls} for t in trajs}


def main(out: str, model_dir: str, qa_dir: str, tp: int) -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch.distributed as dist

    dist.init_process_group("gloo")
    from ggpo_batch.train.rollout import continuous as rollouts
    from ggpo_batch.train.pretrained.hf import eos_ids, load_tokenizer
    from ggpo_batch.train.rollout import environment
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend
    from ggpo_batch.train.task.codec import HfCodec
    from ggpo_batch.train.task.qa import read_items, read_passages
    from ggpo_batch.train.task.retrieval import Retriever
    from tests.train.colocated_ranks import finish

    rank = dist.get_rank()
    codec = HfCodec(load_tokenizer(model_dir), max_model_len=1024, eos_ids=eos_ids(model_dir))
    backend = VllmBackend(None, codec, seed=0, model_dir=Path(model_dir), max_model_len=1024,  # type: ignore[arg-type]
                          dtype="float32", tensor_parallel_size=tp)
    items = read_items(str(Path(qa_dir) / "train.jsonl"), "train")
    retriever = Retriever(read_passages(str(Path(qa_dir) / "passages.jsonl"), "passages"))
    digests: list[str] = []  # the group's episodes as each rank computed them (rollouts.continuous)
    turn_engine = backend.turn_engine

    def spied(temperature: float):  # type: ignore[no-untyped-def]
        engine = turn_engine(temperature)
        agree = engine.agree

        def agree_and_keep(digest: str) -> None:
            digests.append(digest)
            agree(digest)

        engine.agree = agree_and_keep  # type: ignore[method-assign]
        return engine

    backend.turn_engine = spied  # type: ignore[method-assign]

    def run(episodes, uids: list[int], step: int = 0) -> list:  # type: ignore[no-untyped-def,type-arg]
        trajs = [environment.start(items[u], "train", codec.prompt("train", items[u]), uid=u) for u in uids]
        episodes(trajs, backend, retriever, max_turns=4, max_new_tokens=64, temperature=1.0, top_k=2,
                 passage_max_bytes=64, seed=3, step=step, codec=codec)
        return trajs

    mine = list(range(rank * 6, rank * 6 + 6 - 3 * rank))  # rank 0: 0..5, rank 1: 6..8
    seen = {"rank": rank, "uids": mine, "collective": backend.collective,
            "enforce_eager": backend.llm.llm_engine.vllm_config.model_config.enforce_eager,
            "chunked_prefill": backend.llm.llm_engine.vllm_config.scheduler_config.enable_chunked_prefill}
    seen["continuous"] = record(run(rollouts.run_episodes, mine))
    seen["rerun"] = record(run(rollouts.run_episodes, mine))
    seen["turn_by_turn"] = record(run(environment.run_episodes, mine))
    # Other company: the rank's first two trajectories among others, in another order.
    seen["company"] = record(run(rollouts.run_episodes, [20 + rank, mine[1], 30 + rank, mine[0]]))
    # A rank with no episode of its own still steps with its group (an evaluation's last items).
    seen["alone"] = record(run(rollouts.run_episodes, [] if rank else [mine[2]]))
    seen["digests"] = digests
    # Seeded prompts beyond one engine step's token budget (chunked prefill would cut one, and a
    # CPU generator cannot rewind the sample it drew for the cut prompt).
    long = [codec.prompt("train", items[40 + 6 * rank + i]) * 7 for i in range(6)]
    gens = backend.generate(long, 2, 1.0, seed=[100 + 10 * rank + i for i in range(6)])
    seen["long_prompts"] = [sum(map(len, long)), len(gens),
                            backend.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens]
    finish(out, seen, backend)


def run(argv: list[str]) -> None:
    """The entry point a forked rank calls (tests/train/hf/test_hf_episodes.py)."""
    main(argv[0], argv[1], argv[2], int(argv[3]))


if __name__ == "__main__":
    run(sys.argv[1:])
