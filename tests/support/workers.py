"""A real `ggpo-batch worker` in a subprocess, which a test can SIGKILL with every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO
from tests.support.waiting import wait_until


def attempt_logs(folder: Path, lines: int = 30) -> str:
    """The last `lines` of each log and error file in an attempt's folder (the ranks' submitit logs,
    a debug job's error.txt): what an assertion on a run's end prints, so a failure says why."""
    out = []
    for path in sorted(Path(folder).glob("*")):
        if path.is_file() and (path.name.endswith((".err", ".out")) or path.name == "error.txt"):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(out) or f"(no log in {folder})"


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
    """A real `ggpo-batch worker` in its own process group (the worker, its scheduler, a debug
    payload's process), logging to a file."""

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

    def kill(self) -> None:
        """SIGKILL the worker's group and any group a process below it made of its own. Reap the
        worker, so it cannot look alive."""
        groups = {self.proc.pid} | _groups_below(self.proc.pid)
        _signal_groups(groups, signal.SIGKILL)
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


def _groups_below(pid: int) -> set[int]:
    """The process groups of `pid`'s live descendants (one may have made a group of its own)."""
    return {g for p in descendants(pid) if (g := _pgid_or_none(p)) is not None}


def _signal_groups(groups: set[int], signum: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def run_burst_worker(args: list[str], env: dict[str, str], *, timeout: float,
                     verbose: bool = False, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """`ggpo-batch worker --burst ARGS` to its end. Past `timeout`, the worker and a debug payload's
    process are asked where they are (SIGQUIT: the worker's faulthandler prints every thread's
    stack, and the payload's process inherits it), then killed, and the test fails with that output instead of a bare timeout.
    `cwd`: where it runs (`python -m` imports the package from there first)."""
    proc = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", *(["-v"] if verbose else []), "worker", "--burst",
                             *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        groups = {proc.pid} | _groups_below(proc.pid)
        _signal_groups(groups, signal.SIGQUIT)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _signal_groups(groups, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the worker did not end in {timeout:.0f} s; its stacks and last output:\n"
                             f"{err.decode(errors='replace')[-8000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
