"""A rank's vLLM engine is sized for the job (train/rollout/engine_size.py), not for a server; vLLM's
cache goes under the jobs folder unless the worker or profile sets it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ggpo_batch.contracts.allocation import vllm_cache_export
from ggpo_batch.train.rollout.engine_size import MAX_CAPTURE_SIZE, engine_size


def test_the_larger_of_a_step_and_the_evaluation_per_engine() -> None:
    # jobs/exposure-5arm.toml on 4 ranks: 8 prompts x 8 responses a step (16 a rank); an evaluation of
    # 300 held-out items greedy (75 a rank) is the larger
    flagship = engine_size(prompts_per_step=8, group_size=8, eval_items=300, eval_samples=1, world=4)
    assert flagship.max_num_seqs == 75 and flagship.max_cudagraph_capture_size == 75
    assert engine_size(prompts_per_step=8, group_size=8, eval_items=10, eval_samples=1, world=4).max_num_seqs == 16
    # uneven shares round up; a tensor-parallel group's engine serves its ranks' prompts together
    assert engine_size(prompts_per_step=6, group_size=4, eval_items=0, eval_samples=1, world=4).max_num_seqs == 8
    assert engine_size(prompts_per_step=8, group_size=8, eval_items=0, eval_samples=1, world=4,
                       tensor_parallel_size=2).max_num_seqs == 32
    # sampled evaluation: every sample is a sequence; the capture ceiling stays vLLM's
    big = engine_size(prompts_per_step=8, group_size=8, eval_items=1000, eval_samples=8, world=4)
    assert big.max_num_seqs == 2000 and big.max_cudagraph_capture_size == MAX_CAPTURE_SIZE
    assert engine_size(prompts_per_step=0, group_size=1, eval_items=0, eval_samples=1, world=1).max_num_seqs == 1
    with pytest.raises(ValueError):
        engine_size(prompts_per_step=8, group_size=8, eval_items=1, eval_samples=1, world=0)


def test_graphs_are_bounded_only_where_they_are_captured() -> None:
    size = engine_size(prompts_per_step=8, group_size=8, eval_items=300, eval_samples=1, world=4)
    assert size.options(graphs=True) == {"max_num_seqs": 75, "compilation_config": {"max_cudagraph_capture_size": 75}}
    assert size.options(graphs=False) == {"max_num_seqs": 75}  # the CPU, or eager mode: nothing captured


@pytest.mark.parametrize("preset", [None, "/scratch/own cache"])
def test_the_vllm_cache_line_defaults_under_the_jobs_folder(tmp_path: Path, preset: str | None) -> None:
    jobs = tmp_path / "jobs with space"
    env = {"PATH": "/usr/bin:/bin"} | ({"VLLM_CACHE_ROOT": preset} if preset else {})
    out = subprocess.run(["bash", "-c", f'{vllm_cache_export(jobs)}; printf %s "$VLLM_CACHE_ROOT"'], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out == (preset or str(jobs / "vllm-cache"))
