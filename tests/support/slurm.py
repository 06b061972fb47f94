"""Asking the dev Slurm (slurm/dev-cluster) what it did: commands counted, jobs by name, sacct's GPU-hours."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ggpo_batch.executor.base import JobInfo
from ggpo_batch.executor.sacct import run_command
from ggpo_batch.executor.slurm import SlurmExecutor


class CountingRunner:
    """The real command runner, with a record of every command it ran."""

    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.argv.append(list(argv))
        return run_command(argv)

    def count(self, program: str) -> int:
        return sum(1 for a in self.argv if a[0] == program)


def wait_for(ex: SlurmExecutor, job_id: str, done: Callable[[JobInfo], bool], timeout_s: float) -> JobInfo:
    """Poll the executor (sacct) until `done(info)`; fail with the last state seen."""
    end = time.monotonic() + timeout_s
    info = None
    while time.monotonic() < end:
        info = ex.poll([job_id]).get(job_id)
        if info is not None and done(info):
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not get there in {timeout_s} s; last seen {info}")


def final(info: JobInfo) -> bool:
    return info.final


def slurm_jobs(tag: str) -> dict[str, set[str]]:
    """Job name -> Slurm job ids, for every job whose name holds `tag`, as the controller
    (`squeue -t all`, which also keeps ended jobs for MinJobAge) and slurmdbd (sacct) know them.

    Both are asked because sacct misses a job that was held and cancelled, and squeue forgets a job
    after MinJobAge."""
    out: dict[str, set[str]] = {}
    for line in run_command(["squeue", "-h", "-t", "all", "-o", "%i|%j"]).splitlines():
        job_id, _, name = line.strip().partition("|")
        if tag in name:
            out.setdefault(name, set()).add(job_id)
    for line in run_command(["sacct", "-X", "-P", "-n", "-a", "-S", "now-2hours", "-o", "JobID,JobName%200"]).splitlines():
        job_id, _, name = line.strip().partition("|")
        if tag in name:
            out.setdefault(name, set()).add(job_id.split("_")[0])
    return out


def squeue_state(job_id: str) -> str:
    return run_command(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"]).strip()


def sacct_gpu_hours(job_id: str) -> list[float]:
    """GPU-hours of each run of a job (one per requeue) straight from sacct: AllocTRES gres/gpu x ElapsedRaw / 3600."""
    out = []
    for line in run_command(["sacct", "-X", "-P", "-n", "-D", "-j", job_id, "-o", "AllocTRES,ElapsedRaw"]).splitlines():
        tres, _, elapsed = line.partition("|")
        gpus = dict(kv.split("=") for kv in tres.split(",") if "=" in kv).get("gres/gpu", "0")
        out.append(int(gpus) * int(elapsed or 0) / 3600)
    return out


def cancel_tagged(tag: str) -> None:
    """scancel whatever a test left in the queue (jobs whose name holds its `tag`)."""
    for line in run_command(["squeue", "-h", "-o", "%i|%j"]).splitlines():
        job_id, _, name = line.partition("|")
        if tag in name:
            subprocess.run(["scancel", job_id.strip()], check=False)


def wait_ranks_ready(folder: Path, job_id: str, ranks: int, timeout_s: float = 60, settle_s: float = 1.0) -> None:
    """Wait until each of the job's `ranks` submitit tasks has loaded its payload (and so installed
    its USR2 handler): a fixed sleep after RUNNING lost that race on a loaded machine, where srun
    started some tasks seconds late and the signal killed them (exit 15) instead of preempting."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        logs = [Path(folder) / f"{job_id}_{r}_log.out" for r in range(ranks)]
        if all(p.exists() and "Loading pickle" in p.read_text(errors="replace") for p in logs):
            time.sleep(settle_s)  # unpickling, then the handler: a moment after the log line
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id}: not all {ranks} ranks loaded their payload in {timeout_s} s")


def signal_preemption(job_id: str) -> None:
    """What submitit's `SlurmJob._interrupt(timeout=False)` does, without its race: the job's
    preemption signal (USR2, its --signal) to every task. `_interrupt` sends SIGTERM first, in
    another scancel; slurmd has delivered the two out of order, and the TERM, reaching every process
    of the step, killed the `scontrol requeue` that rank 0's USR2 handler was running (a full run,
    job 1238: no requeue reached slurmctld and the job failed). submitit ignores the TERM anyway
    ("Bypassing signal SIGTERM"); `preempt` below is Slurm's own preemption."""
    run_command(["scancel", "--signal=USR2", job_id])


# The dev cluster's partition whose jobs preempt those of the default one on the same node
# (slurm/dev-cluster/slurm.conf.in: higher PriorityTier, PreemptType=preempt/partition_prio).
URGENT_PARTITION = "dev-urgent"
PREEMPTOR_NAME = "ggpo-preemptor"


def preempt(job_id: str, timeout_s: float = 60.0) -> str:
    """Preempt a running job as Slurm does: submit a job of the urgent partition that needs the
    victim's node (all its GPUs), so slurmctld preempts the victim itself, with its own signals in
    its own order (SIGCONT+SIGTERM and the job's --signal at once; requeue or cancel at the end of
    GraceTime). Returns the preemptor's job id once it runs (the victim has left the node); it is
    cancelled then, so the requeued victim can run again."""
    node = run_command(["squeue", "-h", "-j", job_id, "-o", "%N"]).strip().split(",")[0]
    if not node:
        raise AssertionError(f"job {job_id} holds no node to preempt it from")
    gpus = run_command(["scontrol", "show", "node", node]).split("Gres=gpu:", 1)[1].split()[0].split("(")[0]
    out = run_command(["sbatch", "--parsable", "-p", URGENT_PARTITION, "-w", node, "-J", PREEMPTOR_NAME,
                       f"--gpus-per-node={gpus}", "-t", "5", "-o", "/dev/null", "--wrap", "sleep 300"])
    urgent = out.strip().split(";")[0]
    try:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if run_command(["squeue", "-h", "-j", urgent, "-o", "%T"]).strip() == "RUNNING":
                if squeue_state(job_id) == "COMPLETED":  # the node was free: nothing was preempted
                    raise AssertionError(f"job {job_id} completed before it was preempted: give it more to do")
                return urgent
            time.sleep(0.2)
        raise AssertionError(f"the preemptor {urgent} of job {job_id} did not start on {node} in {timeout_s:.0f} s; "
                             f"the victim is {squeue_state(job_id)}")
    finally:
        subprocess.run(["scancel", urgent], check=False)


def release_requeue_hold(job_id: str, timeout_s: float = 90.0) -> None:
    """Start a requeued job now instead of after slurmctld's 120 s requeue hold (its BeginTime), so a
    test stays short. The hold is set when the requeue lands, which may be after sacct already counts
    the restart: an update made before it is undone, so move the start again for as long as squeue
    says the job waits on BeginTime; done once it runs or has left the queue. Released only once the
    job is pending: released while its first run still completes, the second run started at once on
    a node still tearing down the first, and failed in no time (exit 1, 0 s)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        last = run_command(["squeue", "-h", "-j", job_id, "-o", "%T|%r"]).strip()
        state, _, reason = last.partition("|")
        if not last or state in ("RUNNING", "COMPLETED", "CANCELLED", "FAILED"):
            return
        if state == "PENDING" and reason == "BeginTime":
            run_command(["scontrol", "update", f"jobid={job_id}", "starttime=now"])
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still held after {timeout_s:.0f} s: squeue says {last!r}")
