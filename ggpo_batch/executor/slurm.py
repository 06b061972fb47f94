"""The Slurm executor: one attempt of a run = one sbatch through submitit, found again by name.

Exactly-once: `submit` first asks squeue, then sacct, for a job named `job_name(run_key, attempt)`
whose comment is `ggpo:<run_key>:<attempt>`, so a worker killed between sbatch and the ledger
write does not take a second allocation. State comes from one sacct call for all jobs (`poll`).

Preemption: the payload is wrapped so submitit's USR2 handler checkpoints and requeues it
(`scontrol requeue`, same job id); every run of the job id is one sacct record, which the ledger
books as its own attempt (see `accounts`). A TIMEOUT is not requeued unless the profile says so.
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import submitit
from submitit.helpers import DelayedSubmission

from ..errors import ExecutorError
from ..runspec import RunSpec
from .base import Executor, JobInfo, job_name
from .profile import SlurmProfile
from .sacct import JobAccount, Runner, Sacct, normalize_state, run_command

log = logging.getLogger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_SAFE_COMMENT = re.compile(r"^[A-Za-z0-9_./:-]{1,250}$")
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9_./-]")
RECORD_NAME = "record.json"  # the attempt's result record, where ggpo_batch.attempts reads it
_JOB_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")


def job_comment(run_key: str, attempt: int) -> str:
    """The `--comment` of an attempt: `ggpo:<run_key>:<attempt>`, with anything unsafe replaced by `_`."""
    return f"ggpo:{_UNSAFE_KEY_CHARS.sub('_', run_key)[:200]}:{int(attempt)}"


class Requeueable:
    """A payload submitit may checkpoint and requeue on preemption.

    submitit requeues a preempted job only if its function has `checkpoint()`. This wrapper adds
    one, delegating to the payload's own `checkpoint()` when it has one (to save training state).
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn

    def __call__(self) -> Any:
        return self.fn()

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        inner = getattr(self.fn, "checkpoint", None)
        if inner is not None:
            delayed = inner(*args, **kwargs)
            if delayed is None:
                return None  # type: ignore[return-value]  # the payload refuses a requeue
            return DelayedSubmission(Requeueable(delayed.function), *delayed.args, **delayed.kwargs)
        return DelayedSubmission(Requeueable(self.fn))


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
        min_submit_interval_s: float = 0.2,
        find_since: str = "now-30days",
    ) -> None:
        self.profile = profile
        self.folder = Path(folder)
        self.python = python
        self.runner = runner
        self.sacct = sacct if sacct is not None else Sacct(runner=runner)
        self.min_submit_interval_s = min_submit_interval_s
        self.find_since = find_since
        self.sbatch_calls = 0
        self.squeue_calls = 0
        self._last_submit = 0.0

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
        return sorted(ids, key=_id_key)[0] if ids else None

    def submit(self, spec: RunSpec, attempt: int, folder: Path) -> str:
        name, comment = job_name(spec.run_key, attempt), job_comment(spec.run_key, attempt)
        existing = self.find_by(name, comment)
        if existing is not None:
            log.info("run %s attempt %d already submitted as Slurm job %s", spec.run_key, attempt, existing)
            return existing
        if spec.gpus != self.profile.gpus_per_node:
            raise ExecutorError(
                f"run {spec.run_key} asks for {spec.gpus} GPUs, profile {self.profile.name} gives {self.profile.gpus_per_node}"
            )
        from .payload import make_payload  # late: the payload pulls in the method's job class

        folder = Path(folder)
        payload = make_payload(spec, folder / RECORD_NAME)
        return self.submit_callable(payload, name, comment, folder=folder)

    def submit_callable(
        self, fn: Callable[[], Any], name: str, comment: str, *, folder: Path | None = None, **overrides: Any
    ) -> str:
        """sbatch `fn` with the profile's allocation; `overrides` are submitit SlurmExecutor parameters."""
        _check_name(name, comment)
        folder = Path(folder) if folder is not None else self.folder / name
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=self.profile.max_timeout_requeues, python=self.python)
        params = self.profile.to_submitit_parameters()
        params.update(overrides)
        params.update(job_name=name, comment=comment)
        ex.update_parameters(**params)
        wait = self._last_submit + self.min_submit_interval_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # sites rate-limit sbatch RPCs per user
        self._last_submit = time.monotonic()
        self.sbatch_calls += 1
        try:
            job = ex.submit(Requeueable(fn))
        except (submitit.core.utils.FailedJobError, OSError) as exc:
            raise ExecutorError(f"sbatch of {name} failed: {str(exc).strip().splitlines()[-1][:300]}") from None
        log.info("submitted %s as Slurm job %s (%s)", name, job.job_id, comment)
        return str(job.job_id)

    def submission_script(self, name: str, comment: str, folder: Path, **overrides: Any) -> str:
        """The sbatch script `submit_callable` would write (for review and for the saved-copy test)."""
        _check_name(name, comment)
        params = self.profile.to_submitit_parameters()
        params.update(overrides)
        params.update(job_name=name, comment=comment)
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=self.profile.max_timeout_requeues, python=self.python)
        ex.update_parameters(**params)
        return ex._make_submission_file_text(ex._submitit_command_str, "uid")

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
        self.squeue_calls += 1
        try:
            out = self.runner(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T"])
        except ExecutorError:
            return {}  # squeue refuses a list with no id it knows: none of them is known anywhere
        infos = {}
        for line in out.splitlines():
            job_id, _, state = line.strip().partition("|")
            if job_id in ids:
                infos[job_id] = JobInfo(job_id=job_id, state=normalize_state(state))
        return infos

    def accounts(self, job_ids: Iterable[str]) -> dict[str, JobAccount]:
        """One sacct call for all ids, with every run (segment) of each job for the ledger."""
        return self.sacct.accounts(job_ids)

    def cancel(self, job_id: str) -> None:
        if not _JOB_ID.match(str(job_id)):
            raise ExecutorError(f"{job_id!r} is not a Slurm job id")
        self.runner(["scancel", str(job_id)])
        log.info("cancelled Slurm job %s", job_id)


def _check_name(name: str, comment: str) -> None:
    if not _SAFE_NAME.match(name):
        raise ExecutorError(f"job name {name!r} has characters other than [A-Za-z0-9_.-]")
    if not _SAFE_COMMENT.match(comment):
        raise ExecutorError(f"job comment {comment!r} has characters other than [A-Za-z0-9_./:-]")


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.split(r"[_+]", job_id) if p.isdigit())
