"""Shared pieces of the Slurm/worker fault tests: the dev cluster and counting runner of
tests/slurm (imported, not copied), a real `ggpo-batch worker` subprocess that can be SIGKILLed
with its work horse, and helpers that ask Slurm itself how many jobs a run got."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ggpo_batch.executor.sacct import run_command
from tests.slurm.conftest import CountingRunner, dev_cluster, tag  # noqa: F401  (fixtures re-used)

REPO = Path(__file__).resolve().parents[2]

SPEC = """
schema = 1
[experiment]
name = "{name}"
method = "ggpo"
seeds = {seeds}
gpus = 4
loop_budget_seconds = 2
executor = "slurm"
profile = "{profile}"
max_gpu_hours = {max_gpu_hours}
retries = {retries}
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
"""


def write_spec(folder: Path, name: str, *, seeds: list[int], profile: str = "dev-cluster-1task", retries: int = 0,
               max_gpu_hours: float = 1.0) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(SPEC.format(name=name, seeds=seeds, profile=profile, retries=retries,
                                max_gpu_hours=max_gpu_hours))
    return path


def redis_db(number: int) -> Iterator[str]:
    """Body of a `redis_url` fixture on Redis db `number`, flushed before and after."""
    from ..conftest import flushed_redis

    yield from flushed_redis(number)


def worker_environment(settings, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """The environment of a worker subprocess: this test's ledger, Redis db, data dir and queue."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update({"GGPO_DB_URL": settings.db_url, "GGPO_REDIS_URL": settings.redis_url,
                "GGPO_DATA_DIR": str(settings.data_dir), "GGPO_USER": settings.user, "GGPO_QUEUE": settings.queue,
                "GGPO_DEFER_SECONDS": str(settings.defer_seconds),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))})
    env.update(extra)
    return env


class WorkerProcess:
    """A real `ggpo-batch worker` in its own process group (worker + work horse), logging to a file."""

    def __init__(self, env: dict[str, str], log: Path, *, name: str, reconcile_interval: int = 5,
                 burst: bool = False) -> None:
        self.log = log
        argv = [sys.executable, "-c", "from ggpo_batch.cli import main; main()", "worker", "--name", name,
                "--reconcile-interval", str(reconcile_interval)] + (["--burst"] if burst else [])
        self._out = open(log, "wb")  # noqa: SIM115  (closed in kill(); the child writes to it meanwhile)
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=self._out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_log(self, needle: str, timeout_s: float) -> None:
        wait_until(lambda: needle in self.text() or self.proc.poll() is not None, timeout_s, f"{needle!r} in log")
        if needle not in self.text():
            raise AssertionError(f"worker exited ({self.proc.returncode}) before {needle!r}:\n{self.text()[-3000:]}")

    def kill(self, *, horse_too: bool = True) -> None:
        """SIGKILL the worker's group and (unless `horse_too` is False) the work horse's: RQ's horse
        calls setpgrp(), so it has a process group of its own. Reap the worker, so it cannot look alive."""
        groups = {self.proc.pid}
        if horse_too:
            groups |= {g for p in descendants(self.proc.pid) if (g := _pgid_or_none(p)) is not None}
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        for pgid in groups:
            wait_until(lambda g=pgid: not _group_alive(g), 30, f"process group {pgid} gone")
        if not self._out.closed:
            self._out.close()

    def stop(self) -> None:
        """A warm shutdown (SIGTERM), then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        self.kill()


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc (children first found, then theirs)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _pgid_or_none(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(cond: Callable[[], object], timeout_s: float, what: str, interval: float = 0.2) -> object:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = cond()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def slurm_jobs(tag: str) -> dict[str, set[str]]:  # noqa: F811
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
    """GPU-hours of each run of a job straight from sacct: AllocTRES gres/gpu x ElapsedRaw / 3600."""
    out = []
    for line in run_command(["sacct", "-X", "-P", "-n", "-D", "-j", job_id, "-o", "AllocTRES,ElapsedRaw"]).splitlines():
        tres, _, elapsed = line.partition("|")
        gpus = dict(kv.split("=") for kv in tres.split(",") if "=" in kv).get("gres/gpu", "0")
        out.append(int(gpus) * int(elapsed or 0) / 3600)
    return out


def cancel_tagged(tag: str) -> None:  # noqa: F811
    """scancel whatever this test left in the queue."""
    for line in run_command(["squeue", "-h", "-o", "%i|%j"]).splitlines():
        job_id, _, name = line.partition("|")
        if tag in name:
            subprocess.run(["scancel", job_id.strip()], check=False)
