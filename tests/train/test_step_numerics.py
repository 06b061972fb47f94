"""The numerics the docs promise (docs/how-it-works.md), through the trainer's own update on 2 gloo
ranks (DeepSpeed ZeRO-2, float32, the built-in tiny GPT-2): the loss is the token mean over the whole
step across ranks, so ranks that kept different numbers of tokens give the gradient of one process
over all their rows (to 1e-6); a step with no signal on any rank skips the optimizer and leaves the
weights as they were. The ranks: tests/train/numerics_ranks.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.train


def fork_ranks(folder: Path, target: str, world: int = 2) -> list[dict]:  # type: ignore[type-arg]
    """Run `target(folder)` as `world` gloo ranks forked as a local run forks them (train/rankfork.py)."""
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.train.run.rankfork import ForkServer
    from tests.support.paths import REPO

    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        procs.append(ForkServer.start_rank([str(folder)], env, folder / f"rank{rank}.log", target=target, cwd=REPO))
    deadline = time.monotonic() + 300
    try:
        for rank, p in enumerate(procs):
            code = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, (folder / f"rank{rank}.log").read_text(errors="replace")[-3000:]
    finally:
        for p in procs:
            p.kill()
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]


def test_uneven_ranks_give_the_single_process_gradient_and_a_silent_step_changes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ranks = fork_ranks(tmp_path, "tests.train.numerics_ranks:run")
    zero = ranks[0]
    assert ranks[0]["tokens"] != ranks[1]["tokens"] and min(r["tokens"] for r in ranks) > 0  # uneven ranks
    assert zero["same_keys"]
    assert zero["worst"] < 1e-6, zero  # the token mean over the whole step, every rank's tokens
    assert zero["largest"] > 1e-3  # far above the tolerance
    assert zero["defect_worst"] > 1e-4, zero  # the mean of each rank's own token mean: what the check catches
    for r in ranks:
        # No signal on any rank: no pass, no optimizer step, the weights exactly as they were ...
        assert r["silent_steps"] == 0 and r["silent_changed"] == 0.0 and r["silent_grads_read"] == 0
        assert r["silent_gradient_norm"] is None
        assert r["forced_changed"] > 1e-6  # ... which a step on zero gradients would not leave (Adam's momentum)
