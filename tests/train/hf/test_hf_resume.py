"""Resume is exact with vLLM rollouts of a pretrained-format checkpoint: a 2-rank run preempted after
its second step (three steps left, so the signal lands before the run ends on a quick machine too)
and run again equals the uninterrupted run to 1e-6 in every step's loss, gradient
norm and groups, with the same counts and the same final policy (the torch-rollout case, with the
world-size refusal and the planted omissions, is tests/train/test_resume.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("deepspeed")

from tests.support.twins import assert_same_run
from tests.train.test_resume import run_pair

pytestmark = [pytest.mark.vllm, pytest.mark.train, pytest.mark.slow]


def test_a_preempted_two_rank_run_with_vllm_rollouts_resumes_exactly(tmp_path: Path, hf_spec,  # type: ignore[no-untyped-def]
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    spec = hf_spec("paired", budget=600.0, rollout="vllm", max_steps=5, reference_refresh_steps=2, eval_size=2)
    twin, td, resumed, rd = run_pair(tmp_path, spec)
    assert td["rollout"] == rd["rollout"] == "vllm"
    assert_same_run(twin, td, resumed, rd, steps=5)
