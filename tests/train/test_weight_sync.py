"""The post-update weight push and its probe (train/weight_sync.py) with the torch sampler's behaviour
copy: an honest push passes; a push that silently skips a layer fails the probe and the rollout audit.
The criterion itself: test_probe.py; in bfloat16 on real updates: test_probe_calibration.py."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

from ggpo_batch.train.audit.audit import audit
from ggpo_batch.train.config import TrainConfig
from ggpo_batch.train.policy.model import build_model
from ggpo_batch.train.rollout.sampler import TorchSampler
from ggpo_batch.train.run.weight_sync import WeightSync, probe_sequence
from ggpo_batch.train.task.codec import ByteCodec
from ggpo_batch.train.task.qa import load

pytestmark = pytest.mark.train


class SkipsALayer(TorchSampler):
    """The planted defect: the push drops every tensor of block 1 without a word."""

    def sync_weights(self, weights):  # type: ignore[no-untyped-def]
        return super().sync_weights((n, t) for n, t in weights if ".h.1." not in n)


def _update(policy: torch.nn.Module) -> None:
    """Stand-in for one optimizer step: every weight moves a little."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-2)


@pytest.mark.parametrize("backend_class, passes", [(TorchSampler, True), (SkipsALayer, False)])
def test_probe_catches_a_push_that_skips_a_layer(backend_class, passes):  # type: ignore[no-untyped-def]
    cfg = TrainConfig()
    codec, policy = ByteCodec(), build_model(cfg, 0)
    backend = backend_class(copy.deepcopy(policy).eval(), codec)
    tokens = probe_sequence(codec, load(cfg).train[:8])
    assert len(tokens) == 256  # several items' prompts and answers
    sync = WeightSync(policy, 2, backend, tokens, "float32", torch.device("cpu"))
    assert sync.log.baseline == 0.0  # the same kernels on the same weights
    for step in range(2):
        _update(policy)
        seconds = sync.push(step)
        assert seconds >= 0
    log = sync.log
    assert log.steps_checked == 2 and log.passed is passes
    if passes:
        assert max(p.gap for p in log.probes) < 1e-6
    else:
        assert [p.step for p in log.failures] == [0, 1] and min(p.gap for p in log.failures) > log.bound
    res = audit([], codec, log)
    assert bool(res.problems) is not passes
    assert all("weight-sync probe after step" in p for p in res.problems)
    details = res.details()["weight_sync_probe"]
    assert details["checked"] and details["passed"] is passes and details["steps_checked"] == 2
    assert details["bound"] == log.bound == 4e-5


def test_the_file_watch_sees_a_weight_file_written_and_deleted_meanwhile(tmp_path):
    """What tests/train/hf/test_hf_weight_sync.py relies on to say no weight file was written: the
    former push (a safetensors file per step in a fresh temporary folder, deleted at the next) is seen."""
    import tempfile

    from safetensors.torch import save_file

    from tests.support.file_watch import CreatedFiles

    (tmp_path / "before.safetensors").write_bytes(b"")
    with CreatedFiles(tmp_path) as created:
        folder = Path(tempfile.mkdtemp(prefix="ggpo-vllm-", dir=tmp_path))
        time.sleep(0.5)  # the former push wrote its first file a step after making the folder (see file_watch)
        save_file({"w": torch.zeros(2)}, str(folder / "weights-1.safetensors"))
        (folder / "weights-1.safetensors").unlink()
        folder.rmdir()
    assert created.named(".safetensors") == {folder / "weights-1.safetensors"}
