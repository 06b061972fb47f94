"""Held-out evaluation of the trained policy: the run's outcome, one row per item.

After training and the audit, every rank rolls out its share of the evaluation items (the first
`train.eval_size` held-out items; 0, the default, is all of them) with the same episode code as
training (search turns, retrieval, the verifier's reward). Decoding is `train.eval_temperature`:
0 (the default) is greedy -- one answer per item, the most likely token at each step -- and a
temperature > 0 samples `train.eval_samples` answers per item, whose rewards are averaged.

An item counts as exposed when the run trained on it in an exposure group before its budget ended,
on any rank -- not when it was planned. The result goes into the details file (key `evaluation`):
the split means the record keeps, the decoding, and `per_item` rows (item id, exposed, reward, gold
and the answers), from which settlement books the run's outcome in the ledger
(`ggpo_batch/contracts/outcome.py`). An evaluation after training (train/eval_job.py) runs the same
`evaluate_items` on another data file, an item exposed when the run trained on it at all.

Greedy through the rollout backends: both take a temperature, so greedy is asked for as
GREEDY_TEMPERATURE (1e-6). vLLM treats a temperature below 1e-5 as greedy sampling; the torch sampler
divides the logits by it, which makes the distribution one-hot on the argmax (ties within ~1e-5 of
a logit aside), so its draw is the argmax.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...contracts.outcome import GREEDY, SAMPLED

if TYPE_CHECKING:
    from ..config import TrainConfig
    from ..rollout.sampler import RolloutBackend
    from ..task.codec import Codec
    from ..task.qa import Item
    from ..task.retrieval import Retriever

GREEDY_TEMPERATURE = 1e-6
EVAL_TEMPLATE = "eval"


def eval_items(heldout: Sequence[Item], size: int) -> list[Item]:
    """The items evaluated: the first `size` held-out items, all of them when `size` is 0."""
    return list(heldout if size <= 0 else heldout[:size])


def decoding(temperature: float, samples: int) -> dict[str, Any]:
    """How answers are drawn: greedy (temperature 0, one answer) or `samples` sampled ones."""
    if temperature <= 0:
        return {"decoding": GREEDY, "temperature": 0.0, "samples": 1}
    return {"decoding": SAMPLED, "temperature": float(temperature), "samples": int(samples)}


def _mean(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return math.fsum(xs) / len(xs) if xs else None


def summarize(rows: Iterable[Mapping[str, Any]], exposed: Iterable[str], *, planned: int,
              how: Mapping[str, Any]) -> dict[str, Any]:
    """The evaluation of a run from its per-item rows ({"item_id", "gold", "rewards", "answers"},
    from every rank, in evaluation order): the details file's `evaluation` (pure, no torch)."""
    trained = set(exposed)
    per_item = []
    for r in rows:
        rewards = [float(x) for x in r["rewards"]]
        row: dict[str, Any] = {"item_id": r["item_id"], "exposed": r["item_id"] in trained,
                               "reward": _mean(rewards), "gold": r.get("gold"),
                               "answer": r["answers"][0] if r["answers"] else ""}
        if len(rewards) > 1:
            row["rewards"], row["answers"] = rewards, list(r["answers"])
        per_item.append(row)
    ex = [p["reward"] for p in per_item if p["exposed"]]
    un = [p["reward"] for p in per_item if not p["exposed"]]
    return {
        "items": len(per_item), "exposed_items": len(ex),
        "mean_reward": _mean(p["reward"] for p in per_item),
        "exposed_mean_reward": _mean(ex), "unexposed_mean_reward": _mean(un),
        **how,
        "trained_exposure_item_ids": sorted(trained), "planned_exposure_items": planned,
        "per_item": per_item,
    }


def _roll_out(cfg: TrainConfig, codec: Codec, backend: RolloutBackend, retriever: Retriever,
              items: list[tuple[int, Item]], samples: int, temperature: float, seed: int,
              rewards: Any = None) -> list[dict[str, Any]]:
    """This rank's rows: `samples` episodes per (place in the evaluation, item) through the policy's
    backend, retriever and the training's episode code (the one place this module follows how the
    trainer rolls out); an episode's sampling is seeded by the run's seed and its item's place and
    sample, whichever rank runs it."""
    from ..rollout.continuous import run_episodes
    from ..rollout.environment import EVAL_STEP, start

    # The policy's own prompt (the byte vocabulary, or a checkpoint's chat template) and protocol.
    trajs = [start(it, EVAL_TEMPLATE, codec.prompt(EVAL_TEMPLATE, it), uid=place * samples + s)
             for place, it in items for s in range(samples)]
    run_episodes(trajs, backend, retriever, max_turns=cfg.max_turns, max_new_tokens=cfg.max_new_tokens,
                 temperature=temperature, top_k=cfg.retrieval_top_k, passage_max_bytes=cfg.passage_max_bytes,
                 seed=seed, step=EVAL_STEP, codec=codec, rewards=rewards)
    rows = []
    for i, (_, it) in enumerate(items):
        mine = trajs[i * samples:(i + 1) * samples]
        rows.append({"item_id": it.item_id, "gold": it.answer, "rewards": [float(t.reward) for t in mine],
                     "answers": [t.answer for t in mine]})
    return rows


def evaluate_items(cfg: TrainConfig, codec: Codec, backend: RolloutBackend, retriever: Retriever,
                   items: Sequence[Item], exposed: Iterable[str], *, planned: int, rank: int, world: int,
                   seed: int, rewards: Any = None) -> dict[str, Any]:
    """The evaluation of `items` by the policy behind `backend` (module docstring), decoded as the
    run's `cfg` says, each item exposed when its id is in `exposed`, scored by `rewards` (the run's
    `[train.task] reward` when None); collective: every rank rolls out its share and returns the whole
    evaluation. Used by the training job and by an evaluation after training (train/eval_job.py)."""
    import torch
    import torch.distributed as dist

    from ..task.rewards import Rewards

    rewards = rewards if rewards is not None else Rewards(cfg.task)
    how = decoding(cfg.eval_temperature, cfg.eval_samples)
    items = list(items)
    order = {it.item_id: i for i, it in enumerate(items)}
    temperature = how["temperature"] or GREEDY_TEMPERATURE
    with torch.no_grad():
        rows = _roll_out(cfg, codec, backend, retriever, list(enumerate(items))[rank::world], how["samples"],
                         temperature, seed, rewards)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    every = sorted((r for part in gathered for r in part), key=lambda r: order[r["item_id"]])
    return summarize(every, exposed, planned=planned, how=how)

