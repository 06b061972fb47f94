"""The pure core without any service: run moves, the named state sets, GPU-hour accounting."""

from __future__ import annotations

import pytest

from ggpo_batch.contracts import states
from ggpo_batch.contracts.accounting import attempt_gpu_hours, disagreement, disagrees, gpu_hours, total
from ggpo_batch.executor.base import JobAccount, JobInfo


def test_every_state_has_its_moves_and_succeeded_is_terminal() -> None:
    assert set(states.RUN_MOVES) == {None, *states.RUN_STATES}
    assert states.RUN_MOVES["succeeded"] == frozenset()
    for src, dsts in states.RUN_MOVES.items():
        assert dsts <= set(states.RUN_STATES), src


@pytest.mark.parametrize("src,dst,ok", [
    (None, "queued", True), ("queued", "submitted", True), ("submitted", "running", True),
    ("running", "succeeded", True), ("running", "queued", True), ("failed", "queued", True),
    ("queued", "failed", True),  # sbatch refused the only attempt: the run failed with no allocation
    ("queued", "succeeded", False), ("succeeded", "queued", False), ("failed", "succeeded", False),
    ("lost", "running", False), ("not_reproduced", "submitted", False),
])
def test_run_moves(src: str | None, dst: str, ok: bool) -> None:
    assert states.can_move(src, dst) is ok


def test_sets_are_consistent() -> None:
    assert states.INFRASTRUCTURE_ATTEMPT_STATES <= states.ATTEMPT_FINAL
    assert set(states.RETRYABLE_RUN_STATES) <= states.REASON_TO_LEAVE
    assert not states.CANCELLABLE_RUN_STATES & set(states.RETRYABLE_RUN_STATES)
    assert set(states.ATTEMPT_STATE_OF) <= states.SCHEDULER_FINAL
    assert {states.attempt_state_of(s) for s in states.SCHEDULER_INFRASTRUCTURE} == set(
        states.INFRASTRUCTURE_ATTEMPT_STATES)
    assert set(states.RUN_STATE_AFTER) == states.ATTEMPT_FINAL


def test_gpu_hours_formula_and_the_seed_figure() -> None:
    assert gpu_hours(4, 3600) == 4.0
    # seeds/000 20261012/paired_answer: 4 x 3425.0 s
    assert gpu_hours(4, 3425.0) == pytest.approx(3.805555555555556)
    assert JobInfo(job_id="1", state="COMPLETED", alloc_gpus=4, elapsed_seconds=900).gpu_hours == 1.0
    seg = JobInfo(job_id="1", state="PREEMPTED", alloc_gpus=4, elapsed_seconds=1800)
    assert JobAccount(latest=seg, segments=(seg, seg)).gpu_hours == 4.0


def test_disagreement_is_relative_to_the_scheduler() -> None:
    assert disagreement(1.0, 1.0) == 0.0
    assert disagreement(1.02, 1.0) == pytest.approx(0.02)
    assert disagreement(0.0, 0.0) == 0.0 and disagreement(1.0, 0.0) == float("inf")
    assert disagreement(None, 1.0) is None and not disagrees(None, 1.0)
    assert disagrees(1.02, 1.0) and not disagrees(1.005, 1.0)
    assert attempt_gpu_hours(2.0, 1.5) == 1.5 and attempt_gpu_hours(2.0, None) == 2.0
    assert total([1.0, None, 2.5]) == 3.5
