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


def test_usr2_near_the_time_limit_tells_the_payload_and_requeues_nothing(monkeypatch):
    """Judged from the allocation's start (GGPO_ALLOC_START), not the payload's: a job whose setup took
    most of its allocation is near its limit however briefly its payload has run."""
    import os
    import signal
    import time

    from ggpo_batch.contracts.allocation import ALLOC_START_ENV

    class Payload:
        told = 0

        def __call__(self) -> str:
            os.kill(os.getpid(), signal.SIGUSR2)  # delivered before the next bytecode
            return "done"

        def time_limit_signal(self) -> None:
            Payload.told += 1

    preempted = []
    previous = signal.signal(signal.SIGUSR2, lambda *a: preempted.append(a))  # stands for submitit's handler
    try:
        monkeypatch.setenv(ALLOC_START_ENV, str(time.time() - 560))  # 560 s of 600: near
        assert Requeueable(Payload(), time_limit_s=600, signal_delay_s=30)() == "done"
        assert Payload.told == 1 and preempted == []
        monkeypatch.setenv(ALLOC_START_ENV, str(time.time()))
        signal.signal(signal.SIGUSR2, lambda *a: preempted.append(a))  # a finished payload left USR2 ignored
        assert Requeueable(Payload(), time_limit_s=600, signal_delay_s=30)() == "done"
        assert Payload.told == 1 and len(preempted) == 1  # early in the allocation: a preemption, submitit's
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_job_that_stopped_at_its_time_limit_exits_76_and_reads_as_timeout():
    from ggpo_batch.contracts.allocation import TIME_LIMIT_EXIT_CODE
    from ggpo_batch.executor.base import JobAccount, JobInfo
    from ggpo_batch.executor.slurm import _own_exit_states

    code = textwrap.dedent("""
        from ggpo_batch.executor.slurm import Requeueable
        from ggpo_batch.train.run.job import TimeLimitReached
        def stop(): raise TimeLimitReached("checkpointed at step 3")
        Requeueable(stop)()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == TIME_LIMIT_EXIT_CODE == 76, proc.stderr
    ends = [JobInfo("1", "FAILED", exit_code="76:0"), JobInfo("1", "FAILED", exit_code=f"{PREEMPTED_EXIT_CODE}:0"),
            JobInfo("1", "FAILED", exit_code="1:0"), JobInfo("1", "COMPLETED", exit_code="0:0")]
    read = [_own_exit_states(JobAccount(latest=e, segments=(e,))).latest.state for e in ends]
    assert read == ["TIMEOUT", "PREEMPTED", "FAILED", "COMPLETED"]


def test_a_finished_payload_ignores_the_time_limit_signal_through_its_exit():
    """A job whose loop ends at its save deadline exits when Slurm sends USR2 (limit - delay): once the
    payload returned, USR2 is ignored, so Python's finalization, which puts back the default (kill)
    for the signals it handled, cannot let it end a finished job (seen: exit 12 after "Job completed
    successfully", booked FAILED). The child handles USR2 as submitit does, finishes, then is sent
    USR2 at exit, after the interpreter restored the default actions."""
    code = textwrap.dedent("""
        import os, signal, sys
        from ggpo_batch.executor.slurm import Requeueable
        signal.signal(signal.SIGUSR2, lambda s, f: sys.exit(3))  # submitit's handler
        assert Requeueable(lambda: 0)() == 0
        print(signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN, flush=True)
        import atexit
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGUSR2))  # arrives as the process ends
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "True", (out.returncode, out.stdout, out.stderr)
