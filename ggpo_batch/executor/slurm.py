"""The Slurm executor: one attempt of a run = one sbatch through submitit, found again by name.

Exactly-once: `submit` first asks squeue, then sacct, for a job named `job_name(run_key, attempt)`
whose comment is `ggpo:<run_key>:<attempt>`, so a worker killed between sbatch and the ledger
write does not take a second allocation; a caller that has just created the attempt in the ledger
(the worker) passes `lookup=False`: no job can exist for it, and the controller is spared two
queries per submission (reconcile finds the job of a worker that died after sbatch). State comes
from one sacct call for all jobs (`poll`). Every sbatch first takes a token from the pacing bucket
(pacing.py), so bursts of submissions stay under the controller's per-user RPC limit.

Multi-node: the profile's `nodes` (which the spec must match) goes to sbatch as `--nodes`, with
`tasks_per_node` ranks and `gpus_per_node` GPUs on each node.

Preemption: the payload is wrapped so submitit's USR2 handler checkpoints and requeues it
(`scontrol requeue`, same job id) as often as the spec's `retries` allows; every run of the job id is one sacct record, which the ledger
books as its own attempt (see `accounts`). A time limit is never requeued: the batch script tells
the job its limit (allocation.time_limit_export), the job checkpoints before it and exits
TIME_LIMIT_EXIT_CODE, which sacct reports as FAILED and `accounts` as TIMEOUT; settlement then
decides whether the run continues as a new attempt.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import submitit
from submitit.helpers import DelayedSubmission

from ..common import metrics
from ..contracts.allocation import (
    PREEMPTED_EXIT_CODE,
    STATE_OF_EXIT_CODE,
    alloc_start_export,
    allocation_start,
    record_path,
    time_limit_export,
    vllm_cache_export,
)
from ..contracts.canary_spec import CanarySpec
from ..contracts.evaluation_spec import EvaluationSpec, evaluation_ranks
from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.runspec import RunSpec
from ..errors import ExecutorError, GgpoError
from .base import Executor, JobAccount, JobInfo, job_name
from .pacing import Bucket, Unpaced, make_bucket
from .profile import SlurmProfile
from .sacct import Runner, Sacct, normalize_state, run_command

log = logging.getLogger(__name__)
ALLOC_START_LINE = alloc_start_export("$EPOCHREALTIME")  # bash 5: the batch script is #!/bin/bash
# The ranks' rendezvous port (rank 0's TCPStore), set on the batch host (rank 0's) as the allocation
# starts: from the job id, below the kernel's ephemeral port range, so no outgoing connection on the
# node can be holding it (submitit's own choice, 20000-60000 from the job id, lies mostly inside that
# range, and rank 0 failed with EADDRINUSE when a client connection had the port); a port something
# already listens on (another job's rendezvous, a service; seen in a full run of the suite, job 1240)
# is passed over for the next one, stepping by a prime, up to 50 tries (bash's /dev/tcp: refused at
# once where nothing listens). The tasks get it through srun's environment; a profile's own setup
# line may still set another.
RENDEZVOUS_PORT_LINE = ("read -r _lo _hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || _lo=32768; "
                        "(( _lo > 11000 )) || _lo=11000; (( MASTER_PORT = 10000 + SLURM_JOB_ID % (_lo - 10000) )); "
                        "for _try in {1..50}; do (exec 3<>/dev/tcp/127.0.0.1/$MASTER_PORT) 2>/dev/null || break; "
                        "(( MASTER_PORT = 10000 + (MASTER_PORT - 10000 + 7919) % (_lo - 10000) )); done; "
                        "export MASTER_PORT")

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_SAFE_COMMENT = re.compile(r"^[A-Za-z0-9_./:-]{1,250}$")
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9_./-]")
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def job_comment(run_key: str, attempt: int) -> str:
    """The `--comment` of an attempt: `ggpo:<run_key>:<attempt>`, with anything unsafe replaced by `_`."""
    return f"ggpo:{_UNSAFE_KEY_CHARS.sub('_', run_key)[:200]}:{int(attempt)}"


# submitit judges "timeout or preemption" by elapsed time and, for limits under ~50 min, calls
# every signal a timeout; its countdown is therefore disabled and Requeueable decides instead.
_SUBMITIT_TIMEOUT_COUNTDOWN = 1_000_000
# Slurm sends the time-limit signal up to 60 s before it is due (its event resolution), plus slack.
_TIMEOUT_MARGIN_S = 65.0


class Requeueable:
    """A payload that submitit checkpoints and requeues on preemption, at most `requeues_left` times.

    USR2 is judged from the time the allocation has run (from GGPO_ALLOC_START). Near the time
    limit it is the time limit's: the payload is told (its `time_limit_signal()`, if it has one:
    the training job checkpoints at its own deadline and stops), and nothing is requeued.
    Otherwise it is a preemption, for submitit's handler, which calls `checkpoint()`: with an
    allowance left (`retries = N` in the spec; 0 by default) the job is requeued, delegating to
    the payload's own `checkpoint()` to save its state; without one the job exits
    PREEMPTED_EXIT_CODE. A payload that stops by raising a GgpoError with one of the exit codes
    the executor reads (allocation.STATE_OF_EXIT_CODE) exits with that code.
    """

    def __init__(self, fn: Callable[[], Any], requeues_left: int = 0, *, time_limit_s: float = float("inf"),
                 signal_delay_s: float = 0.0) -> None:
        self.fn = fn
        self.requeues_left = requeues_left
        self.time_limit_s = time_limit_s
        self.signal_delay_s = signal_delay_s
        self._started = time.monotonic()

    def __call__(self) -> Any:
        self._started = time.monotonic()
        main_thread = threading.current_thread() is threading.main_thread()  # where signals can be handled
        if main_thread:
            submitit_handler = signal.getsignal(signal.SIGUSR2)
            if callable(submitit_handler):
                signal.signal(signal.SIGUSR2, functools.partial(self._on_usr2, submitit_handler))
        try:
            result = self.fn()
        except GgpoError as exc:
            if exc.exit_code not in STATE_OF_EXIT_CODE:
                raise
            log.warning("%s: exiting %d", exc.message, exc.exit_code)
            logging.shutdown()
            os._exit(exc.exit_code)
        if main_thread:
            # Done: a USR2 from now on (the profile's time-limit signal, sent at limit - delay, when a
            # job whose loop ends at its save deadline is exiting) has nothing left to save. Ignored,
            # not left to Python: at finalization it puts back USR2's default action, which kills, and a
            # job that had said "completed successfully" was booked FAILED, exit 12 (a full run).
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        return result

    def _on_usr2(self, submitit_handler: Callable[..., Any], signum: int, frame: Any) -> None:
        if not self.timed_out():
            submitit_handler(signum, frame)  # a preemption: checkpoint() and requeue, or exit
            return
        told = getattr(self.fn, "time_limit_signal", None)
        log.warning("time limit near (USR2): %s", "the job checkpoints at its deadline and stops" if told else
                    "not requeued; Slurm ends the job (TIMEOUT)")
        if told is not None:
            told()

    def _next(self, fn: Callable[[], Any]) -> Requeueable:
        return Requeueable(fn, self.requeues_left - 1, time_limit_s=self.time_limit_s,
                           signal_delay_s=self.signal_delay_s)

    def timed_out(self) -> bool:
        """Is the allocation near its time limit? Counted from its start, not from this payload's."""
        ran = max(time.monotonic() - self._started, time.time() - allocation_start())
        return ran >= self.time_limit_s - self.signal_delay_s - _TIMEOUT_MARGIN_S

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        if self.timed_out():
            log.warning("time limit reached: not requeued; waiting for Slurm to end the job (TIMEOUT)")
            while True:
                time.sleep(60)
        if self.requeues_left <= 0:
            log.warning("preempted with no requeue allowed: exiting %d", PREEMPTED_EXIT_CODE)
            logging.shutdown()
            os._exit(PREEMPTED_EXIT_CODE)
        inner = getattr(self.fn, "checkpoint", None)
        if inner is None:
            return DelayedSubmission(self._next(self.fn))
        delayed = inner(*args, **kwargs)
        if delayed is None:  # the payload refuses a requeue
            logging.shutdown()
            os._exit(PREEMPTED_EXIT_CODE)
        return DelayedSubmission(self._next(delayed.function), *delayed.args, **delayed.kwargs)


class SlurmExecutor(Executor):
    """Submits attempts to Slurm with the allocation of a `SlurmProfile`."""

    name = "slurm"

    def __init__(
        self,
        profile: SlurmProfile,
        folder: Path,
        *,
        python: str | None = None,
        sacct: Sacct | None = None,
        runner: Runner = run_command,
        pacer: Bucket | None = None,
        min_submit_interval_s: float | None = None,
        find_since: str = "now-30days",
    ) -> None:
        """`pacer`: the sbatch token bucket (default: the profile's pace, in this process);
        `min_submit_interval_s=0` is the older way to say unpaced (tests)."""
        self.profile = profile
        self.folder = Path(folder)
        self.python = python
        self.runner = runner
        self.sacct = sacct if sacct is not None else Sacct(runner=runner)
        if pacer is None:
            pacer = Unpaced() if min_submit_interval_s == 0 else make_bucket(profile.pace)
        self.pacer = pacer
        self.find_since = find_since
        self.sbatch_calls = 0
        self.squeue_calls = 0
        self.paced_seconds = 0.0

    # -- submission ---------------------------------------------------------------------------

    def find(self, spec: RunSpec, attempt: int, folder: Path | None = None) -> str | None:
        """The job of (run, attempt) if Slurm has one; `folder` is not needed (the name finds it)."""
        return self.find_by(job_name(spec.run_key, attempt), job_comment(spec.run_key, attempt))

    def find_by(self, name: str, comment: str) -> str | None:
        """The id of a job with this name and comment: squeue first, then sacct.

        `squeue -t all` also lists jobs that ended within the controller's MinJobAge, which covers
        the second or so slurmdbd lags behind; sacct covers everything older.
        """
        _check_name(name, comment)
        self.squeue_calls += 1
        out = self.runner(["squeue", "-h", "-t", "all", "--name", name, "-o", "%i|%j|%k"])
        ids = []
        for line in out.splitlines():
            job_id, _, rest = line.partition("|")
            jname, _, jcomment = rest.partition("|")
            if jname == name and jcomment == comment:
                ids.append(job_id.strip())
        if not ids:
            for job_id, account in self.sacct.by_name(name, since=self.find_since).items():
                # sacct stores the comment with the job's end; a pending/requeued record shows none
                if account.name == name and (comment in account.comments or not set(account.comments) - {""}):
                    ids.append(job_id)
        if len(ids) > 1:
            log.warning("several Slurm jobs named %s (%s); using the first", name, ", ".join(ids))
        return min(ids, key=_id_key) if ids else None

    def submit(self, spec: RunSpec | EvaluationSpec | CanarySpec, attempt: int, folder: Path, *, lookup: bool = True,
               priority: str = DEFAULT_PRIORITY) -> str:
        name, comment = job_name(spec.run_key, attempt), job_comment(spec.run_key, attempt)
        existing = self.find_by(name, comment) if lookup else None
        if existing is not None:
            log.info("run %s attempt %d already submitted as Slurm job %s", spec.run_key, attempt, existing)
            return existing
        from .payload import make_payload

        if isinstance(spec, CanarySpec):  # `gpus` GPUs of one node, one process, `minutes`; never requeued
            payload = make_payload(spec, record_path(Path(folder)))
            return self.submit_callable(payload, name, comment, folder=Path(folder), requeues=0,
                                        **canary_allocation(self.profile, spec.gpus, spec.minutes))
        if isinstance(spec, EvaluationSpec):  # its own allocation: `gpus` GPUs of one node
            payload = make_payload(spec, record_path(Path(folder)))
            return self.submit_callable(payload, name, comment, folder=Path(folder), requeues=0,
                                        **evaluation_allocation(self.profile, spec.gpus))
        if spec.gpus != self.profile.gpus_per_node:
            raise ExecutorError(
                f"run {spec.run_key} asks for {spec.gpus} GPUs, profile {self.profile.name} gives {self.profile.gpus_per_node}"
            )
        if spec.nodes != self.profile.nodes:
            raise ExecutorError(
                f"run {spec.run_key} asks for {spec.nodes} nodes, profile {self.profile.name} gives {self.profile.nodes}"
            )
        folder = Path(folder)
        payload = make_payload(spec, record_path(folder))
        return self.submit_callable(payload, name, comment, folder=folder, requeues=spec.retries,
                                    **self.profile.priority_parameters(priority))

    def submit_callable(
        self, fn: Callable[[], Any], name: str, comment: str, *, folder: Path | None = None, requeues: int = 0,
        **overrides: Any,
    ) -> str:
        """sbatch `fn` with the profile's allocation; `requeues`: preemption requeues allowed (each one a
        new run of the same job id, booked as its own attempt); `overrides`: submitit SlurmExecutor parameters."""
        _check_name(name, comment)
        folder = Path(folder) if folder is not None else self.folder / name
        params = self._parameters(name, comment, overrides, requeues=requeues)
        ex = self._submitit(folder, params)
        payload = Requeueable(fn, requeues, time_limit_s=60.0 * params["time"], signal_delay_s=params["signal_delay_s"])
        waited = self.pacer.acquire()  # sites rate-limit RPCs per user
        self.paced_seconds += waited
        metrics.observe(metrics.SBATCH_PACING_WAIT, waited)
        self.sbatch_calls += 1
        try:
            job = ex.submit(payload)
        except (submitit.core.utils.FailedJobError, OSError) as exc:
            raise ExecutorError(f"sbatch of {name} failed: {str(exc).strip().splitlines()[-1][:300]}") from None
        log.info("submitted %s as Slurm job %s (%s)", name, job.job_id, comment)
        return str(job.job_id)

    def submission_script(self, name: str, comment: str, folder: Path, *, requeues: int = 0, **overrides: Any) -> str:
        """The sbatch script `submit_callable` would write (for review and for the saved-copy test)."""
        _check_name(name, comment)
        ex = self._submitit(folder, self._parameters(name, comment, overrides, requeues=requeues))
        return ex._make_submission_file_text(ex._submitit_command_str, "uid")

    def _parameters(self, name: str, comment: str, overrides: dict[str, Any], *, requeues: int = 0) -> dict[str, Any]:
        params = self.profile.to_submitit_parameters()
        params.update(overrides)
        params.update(job_name=name, comment=comment)
        # Slurm requeues a batch job on its own when its node fails (JobRequeue=1, the default),
        # which would run an attempt again that the spec allows no retry for: forbid it unless the
        # spec allows requeues; with an allowance Requeueable (preemption) and Slurm (node failure) may.
        extra = {k: v for k, v in params.get("additional_parameters", {}).items() if k not in ("requeue", "no_requeue")}
        extra["requeue" if requeues > 0 else "no_requeue"] = True
        nice = params.pop("nice", None)  # a run's priority (profile.priority_parameters): not a submitit parameter
        if nice is not None:
            extra["nice"] = nice
        params["additional_parameters"] = extra
        # The batch script's first lines: the allocation's start (the job's own GPU-hour clock), its
        # time limit and signal delay (the job's save deadline), then the ranks' rendezvous port.
        params["setup"] = [ALLOC_START_LINE, time_limit_export(60.0 * params["time"], params["signal_delay_s"]),
                           RENDEZVOUS_PORT_LINE, vllm_cache_export(self.folder),
                           metrics.UNSET_FOR_JOBS, *params.get("setup", [])]
        return params

    def _submitit(self, folder: Path, params: dict[str, Any]) -> submitit.SlurmExecutor:
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=_SUBMITIT_TIMEOUT_COUNTDOWN, python=self.python)
        ex.update_parameters(**params)
        return ex

    # -- state ----------------------------------------------------------------------------------

    def poll(self, job_ids: Iterable[str]) -> dict[str, JobInfo]:
        """One sacct call for all ids; `restarts` counts requeues of each job.

        slurmdbd learns of a job a moment after sbatch returns: ids sacct does not know yet are
        asked of the controller in one squeue call, so a fresh job is never mistaken for a lost one.
        """
        ids = sorted({str(j) for j in job_ids})
        infos = {k: a.latest for k, a in self.accounts(ids).items()}
        missing = [j for j in ids if j not in infos]
        if missing:
            infos.update(self._squeue_states(missing))
        return infos

    def _squeue_states(self, ids: list[str]) -> dict[str, JobInfo]:
        """The controller's state of jobs slurmdbd has no record of yet. A job that ended after
        holding nodes is not final until sacct has its record: squeue knows no allocation, and a
        job cancelled before slurmctld had registered it with slurmdbd read CANCELLED with no GPUs
        (it would be booked with 0 GPU-hours). It reads as Slurm's COMPLETING until sacct answers;
        a job that ended without nodes (cancelled while pending) is final at once."""
        self.squeue_calls += 1
        try:
            out = self.runner(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%N"])
        except ExecutorError:
            return {}  # squeue refuses a list with no id it knows: none of them is known anywhere
        infos = {}
        for line in out.splitlines():
            job_id, _, rest = line.strip().partition("|")
            raw, _, nodes = rest.partition("|")
            if job_id in ids:
                info = JobInfo(job_id=job_id, state=normalize_state(raw))
                if info.final and nodes.strip():
                    info = replace(info, state=normalize_state("COMPLETING"))
                infos[job_id] = info
        return infos

    def accounts(self, job_ids: Iterable[str]) -> dict[str, JobAccount]:
        """One sacct call for all ids, with every run (segment) of each job for the ledger."""
        return {k: _own_exit_states(a) for k, a in self.sacct.accounts(job_ids).items()}

    def cancel(self, job_id: str) -> None:
        if not _JOB_ID.match(str(job_id)):
            raise ExecutorError(f"{job_id!r} is not a Slurm job id")
        self.runner(["scancel", str(job_id)])
        log.info("cancelled Slurm job %s", job_id)


def evaluation_allocation(profile: SlurmProfile, gpus: int) -> dict[str, Any]:
    """submitit parameters of an evaluation after training on `gpus` GPUs of one node of `profile`,
    with the profile's ranks per GPU (evaluation_spec.evaluation_ranks)."""
    if gpus > profile.gpus_per_node:
        raise ExecutorError(f"an evaluation on {gpus} GPUs does not fit a node of profile {profile.name} "
                            f"({profile.gpus_per_node} GPUs)")
    ranks = evaluation_ranks(gpus, gpus_per_node=profile.gpus_per_node, tasks_per_node=profile.tasks_per_node)
    return {"nodes": 1, "gpus_per_node": gpus, "ntasks_per_node": ranks}


def canary_allocation(profile: SlurmProfile, gpus: int, minutes: float) -> dict[str, Any]:
    """submitit parameters of a canary: `gpus` GPUs of one node of `profile`, one task (the canary is
    one process: train/run/canary.py), a time limit of `minutes`."""
    if gpus > profile.gpus_per_node:
        raise ExecutorError(f"a canary on {gpus} GPUs does not fit a node of profile {profile.name} "
                            f"({profile.gpus_per_node} GPUs)")
    return {"nodes": 1, "gpus_per_node": gpus, "ntasks_per_node": 1, "time": max(1, math.ceil(minutes))}


def _own_exit_states(account: JobAccount) -> JobAccount:
    """A job that exited with one of the codes the executor reads says why it stopped: preempted with
    no requeue left (PREEMPTED), or checkpointed at its time limit (TIMEOUT)."""
    def fix(info: JobInfo) -> JobInfo:
        code = (info.exit_code or "").split(":")[0]
        if info.state == "FAILED" and code.isdigit() and int(code) in STATE_OF_EXIT_CODE:
            return replace(info, state=STATE_OF_EXIT_CODE[int(code)])
        return info

    return replace(account, latest=fix(account.latest), segments=tuple(fix(s) for s in account.segments))


def _check_name(name: str, comment: str) -> None:
    if not _SAFE_NAME.match(name):
        raise ExecutorError(f"job name {name!r} has characters other than [A-Za-z0-9_.-]")
    if not _SAFE_COMMENT.match(comment):
        raise ExecutorError(f"job comment {comment!r} has characters other than [A-Za-z0-9_./:-]")


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.split(r"[_+]", job_id) if p.isdigit())
