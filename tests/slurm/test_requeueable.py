"""The preemption wrapper: requeues only within the run's allowance, keeps the payload's own state,
and tells a timeout (not requeued) from a preemption by how long the job has run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from submitit.helpers import Checkpointable, DelayedSubmission

from ggpo_batch.executor.slurm import PREEMPTED_EXIT_CODE, Requeueable


class Stateful(Checkpointable):
    def __init__(self, step: int = 0) -> None:
        self.step = step

    def __call__(self) -> int:
        return self.step

    def checkpoint(self, *args, **kwargs) -> DelayedSubmission:  # type: ignore[no-untyped-def]
        return DelayedSubmission(Stateful(self.step + 10))


def test_allowance_counts_down_and_payload_state_is_kept():
    first = Requeueable(Stateful(1), requeues_left=2, time_limit_s=3600, signal_delay_s=90).checkpoint()
    assert isinstance(first.function, Requeueable) and first.function.requeues_left == 1
    assert first.function.time_limit_s == 3600 and first.function.signal_delay_s == 90
    assert first.function() == 11  # the payload's own checkpoint() made the resumed state
    second = first.function.checkpoint()
    assert second.function.requeues_left == 0 and second.function() == 21


def test_plain_callable_is_resubmitted_as_is():
    d = Requeueable(lambda: "same", requeues_left=1).checkpoint()
    assert d.function() == "same" and d.function.requeues_left == 0


def test_timeout_is_judged_by_run_time():
    assert not Requeueable(lambda: 0, time_limit_s=600, signal_delay_s=90).timed_out()
    # Slurm may signal up to 60 s early: under a 1 min limit every signal is the time limit's
    assert Requeueable(lambda: 0, time_limit_s=60, signal_delay_s=30).timed_out()
    assert not Requeueable(lambda: 0, time_limit_s=900, signal_delay_s=30).timed_out()


def test_no_allowance_exits_with_the_preempted_code():
    code = textwrap.dedent("""
        from ggpo_batch.executor.slurm import Requeueable
        Requeueable(lambda: 1, requeues_left=0, time_limit_s=3600).checkpoint()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == PREEMPTED_EXIT_CODE, proc.stderr
