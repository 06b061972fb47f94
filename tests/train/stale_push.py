"""One rank of a training job with a planted stale-weights defect: its vLLM push silently drops every
tensor of block 1 (tests/train/test_vllm_colocated.py). Arguments as `ggpo_batch.train.run.launch`."""

from __future__ import annotations

import sys

from ggpo_batch.train.rollout import vllm_backend
from ggpo_batch.train.rollout.sampler import weight_items
from ggpo_batch.train.run import launch

_push = vllm_backend.VllmBackend.sync_weights


def _skips_block_1(self, weights):  # type: ignore[no-untyped-def]
    return _push(self, ((n, t) for n, t in weight_items(weights) if ".h.1." not in n))


def run(argv: list[str]) -> int:
    """The entry point a forked rank calls (tests/train/test_vllm_colocated.py): a rank of a local run
    whose pushes skip block 1."""
    vllm_backend.VllmBackend.sync_weights = _skips_block_1  # type: ignore[method-assign]
    return launch.main(argv)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
