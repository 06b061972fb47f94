"""One gloo rank of the step-numerics check (tests/train/test_step_numerics.py): the trainer's own
update (`Trainer._update`, DeepSpeed ZeRO-2, float32 on the CPU) over rows that differ between the
ranks, its reduced gradient read at the optimizer step; rank 0 computes the single-process
reference over every rank's rows. Then a step with no signal on any rank. Writes
`<folder>/rank<N>.json`."""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from pathlib import Path

ROWS = {0: [40, 25, 33], 1: [12]}  # the ranks' rows (lengths): 3 rows against 1, unequal token counts


def rows_of(lengths: list[int], seed: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(tokens, sources, behaviour log-probs): a prompt, then generated tokens with tool output between."""
    from ggpo_batch.train.rollout.environment import GENERATED, PROMPT, TOOL

    rng = random.Random(seed)
    out = []
    for n in lengths:
        prompt = min(8, n - 2)
        src = [PROMPT] * prompt + [rng.choice([GENERATED, GENERATED, TOOL]) for _ in range(n - prompt)]
        out.append(([rng.randrange(1, 250) for _ in range(n)], src, [0.0] * n))
    return out


def batch_of(rows, pad_id: int):  # type: ignore[no-untyped-def]
    from ggpo_batch.train.policy.batch import collate
    from ggpo_batch.train.rollout.environment import GENERATED

    ids, attn, src, blp = collate(rows, pad_id)
    return ids, attn, src[:, 1:] == GENERATED, blp


def reference_gradients(model, reference, rows, adv, trainer, by_rank):  # type: ignore[no-untyped-def]
    """The single-process loss over `rows` (one pass, one token mean), or with `by_rank` the mean of each
    rank's own token mean (the planted defect): every parameter's gradient."""
    import torch

    from ggpo_batch.train.policy.ggpo import ggpo_loss
    from ggpo_batch.train.policy.logprobs import masked_logprobs

    model.zero_grad()
    groups = by_rank or [list(range(len(rows)))]
    for idx in groups:
        ids, attn, mask, _ = batch_of([rows[i] for i in idx], trainer.codec.pad_id)
        logp = masked_logprobs(model, model, ids, attn, mask, trainer.cfg.temperature, trainer.codec, trainer.chunks)
        with torch.no_grad():
            ref = masked_logprobs(reference, reference, ids, attn, mask, trainer.cfg.temperature, trainer.codec,
                                  trainer.chunks)
        loss, _ = ggpo_loss(logp, logp.detach(), ref, torch.tensor([adv[i] for i in idx]), mask, trainer.gcfg)
        (loss / len(groups)).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def main(folder: str) -> None:
    import torch
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_grad

    from ggpo_batch.train.config import TrainConfig
    from ggpo_batch.train.policy.step_figures import StepFigures
    from ggpo_batch.train.run.job import init_process_group, release_process_group
    from ggpo_batch.train.run.trainer import Trainer
    from tests.train.conftest import make_spec

    init_process_group(False)
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = make_spec("clean", budget=1e9, micro_batch_size=2)
    trainer = Trainer(spec, TrainConfig.from_table(spec.train, "t"), rank=rank, world=world,
                      device=torch.device("cpu"), budget_seconds=1e9)
    seen: dict = {"rank": rank}
    try:
        rows = rows_of(ROWS[rank], seed=rank)
        adv = [1.3, -0.7, 0.4][: len(rows)] if rank == 0 else [-1.1]
        every: list = [None] * world
        dist.all_gather_object(every, (rows, adv))
        start = copy.deepcopy(trainer.engine.module)  # the weights before the update (the same on every rank)
        grads: dict = {}
        real_step = trainer.engine.step

        def step_and_read() -> None:  # the reduced gradient, read where the optimizer is about to use it
            if trainer.engine.is_gradient_accumulation_boundary():
                for n, p in trainer.engine.module.named_parameters():
                    grads[n] = safe_get_full_grad(p).detach().clone()
            real_step()

        trainer.engine.step = step_and_read  # type: ignore[method-assign]
        batch = batch_of(rows, trainer.codec.pad_id)
        trainer._update(batch, adv, [], StepFigures(), trainer._plan(batch[1]))
        seen["tokens"] = int(batch[2].sum())
        if rank == 0:
            all_rows = [r for rs, _ in every for r in rs]
            all_adv = [a for _, a in every for a in a]
            ref_module = trainer.reference.module
            want = reference_gradients(copy.deepcopy(start), ref_module, all_rows, all_adv, trainer, None)
            cut = len(every[0][0])
            defect = reference_gradients(copy.deepcopy(start), ref_module, all_rows, all_adv, trainer,
                                         [list(range(cut)), list(range(cut, len(all_rows)))])
            seen["worst"] = max(float((grads[n] - want[n]).abs().max()) for n in want)
            seen["largest"] = max(float(g.abs().max()) for g in want.values())
            seen["defect_worst"] = max(float((grads[n] - defect[n]).abs().max()) for n in defect)
            seen["same_keys"] = sorted(want) == sorted(grads)
        # A step with no signal on any rank: every row's mask empty (all groups dropped).
        steps = trainer.engine.global_steps
        before = {n: p.detach().clone() for n, p in trainer.engine.module.named_parameters()}
        silent = rows_of([9], seed=10 + rank)
        silent = [(t, [0] * len(s), b) for t, s, b in silent]  # no generated token: an empty loss mask
        batch = batch_of(silent, trainer.codec.pad_id)
        grads.clear()
        figures = StepFigures()
        trainer._update(batch, [0.0], [], figures, trainer._plan(batch[1]))
        after = dict(trainer.engine.module.named_parameters())
        seen["silent_changed"] = max(float((after[n].detach() - before[n]).abs().max()) for n in before)
        seen["silent_steps"] = trainer.engine.global_steps - steps
        seen["silent_grads_read"] = len(grads)
        seen["silent_gradient_norm"] = figures.gradient_norm
        # What skipping saves it from: an optimizer step on zero gradients still moves the weights (Adam's momentum).
        trainer.engine.set_gradient_accumulation_boundary(True)
        trainer.engine.backward(sum((p * 0).sum() for p in trainer.engine.module.parameters()), scale_wrt_gas=False)
        real_step()
        seen["forced_changed"] = max(float((p.detach() - before[n]).abs().max())
                                     for n, p in trainer.engine.module.named_parameters())
    finally:
        Path(folder, f"rank{rank}.json").write_text(json.dumps(seen))
        trainer.close()
        release_process_group()


def run(argv: list[str]) -> None:
    """The entry point a forked rank calls."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main(argv[0])


if __name__ == "__main__":
    run(sys.argv[1:])
