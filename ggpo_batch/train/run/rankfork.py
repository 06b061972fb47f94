"""Start local CPU ranks by forking them from a process that has imported torch, DeepSpeed,
transformers and the trainer once.

Those imports cost about 5-9 s of CPU per rank; a local run (`train_local`) used to pay them in every
rank, and a process that starts several local runs (`ggpo-batch train`, the test suite) in every rank
of every run. A rank is forked by the machine's rank server (executor/rank_server.py, one per user,
import-time environment, preload and state of the code, shared by every process that starts ranks,
the local executor's included), through the client that stands in for it (common/rank_client.py):
`start_rank` returns that client's `subprocess.Popen`. A run with vLLM rollouts gets a server that
has imported vLLM as well (about 2.2 CPU-seconds a rank otherwise).

With the rank server switched off (`GGPO_RANK_SERVER=off`) a launching process forks its ranks from
a fork server of its own instead: a child (`python -m ggpo_batch.train.run.rankfork`) that preloads,
then reads one request per line (the rank's entry point and argv, environment, working directory,
log file) and forks the rank, which runs `launch.main` (or, for tests, another entry point). It has
no Python thread (OpenBLAS's idle pools are re-made in a child by their fork handlers), so a fork
copies a consistent process; ranks are CPU-only (CUDA_VISIBLE_DEVICES=""), so no CUDA state crosses
a fork. A rank's exit status is written by the server, which reaps it, to a status file beside its
log. Its imports fixed what the environment meant at import time: a request whose environment differs
there (common/import_env.py) gets a server of its own, and so does a run with vLLM rollouts. After
its imports the server freezes its objects (`gc.freeze()`): its ranks' collections do not walk them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

from ...common import rank_client
from ...common.import_env import import_time_env
from ...common.reaping import reaped
from ...errors import GgpoError
from .rank_target import call

# A rank of a local run (train/launch.py).
LAUNCH = "ggpo_batch.train.run.launch:main"
# What the machine's rank server runs (`python -m`): the rank's entry point, "module:function", then its argv.
TARGET_MODULE = "ggpo_batch.train.run.rank_target"


class Rank:
    """One forked rank, with the part of `subprocess.Popen` that `train_local` uses."""

    def __init__(self, pid: int, status: Path) -> None:
        self.pid, self.status = pid, status
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.status.exists():
            text = self.status.read_text().strip()
            if text:
                self.returncode = int(text)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The launching process's fork servers, one per import-time environment and preload (started on
    first use, kept until the launching process ends: a process that alternates between them, as
    the test suite does, never pays a server's imports twice)."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _servers: ClassVar[dict[str, ForkServer]] = {}

    def __init__(self, env: dict[str, str], *, vllm: bool) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "ggpo_batch.train.run.rankfork",
                                      *(["--vllm"] if vllm else [])],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    @staticmethod
    def key(env: dict[str, str], *, vllm: bool) -> str:
        return json.dumps([import_time_env(env), vllm], sort_keys=True)

    @classmethod
    def start_rank(cls, argv: list[str], env: dict[str, str], log_path: Path, *, target: str = LAUNCH,
                   cwd: Path | None = None, vllm: bool = False) -> RankProcess:
        """Fork one rank running `target` ("module:function", called with `argv`; it returns the exit
        code or None for 0) in `env` and `cwd`, its output in `log_path`; `vllm`: from a server that
        has imported vLLM too (a run with vLLM rollouts). Forked by the machine's rank server unless
        `env` switches it off."""
        if rank_client.enabled(env):
            return machine_rank(argv, env, log_path, target=target, cwd=cwd, vllm=vllm)
        status = log_path.with_name(log_path.name + ".status")
        status.unlink(missing_ok=True)
        request = json.dumps({"target": target, "argv": argv, "env": env, "cwd": str(cwd or os.getcwd()),
                              "log": str(log_path), "status": str(status)})
        key = cls.key(env, vllm=vllm)
        with cls._lock:
            server = cls._servers.get(key)
            if server is None or server.proc.poll() is not None:
                server = cls._servers[key] = ForkServer(env, vllm=vllm)
            assert server.proc.stdin is not None and server.proc.stdout is not None
            server.proc.stdin.write(request + "\n")
            server.proc.stdin.flush()
            reply = server.proc.stdout.readline()
        if not reply.strip().isdigit():
            raise GgpoError(f"the rank fork server did not start a rank (it exited {server.proc.poll()}; "
                            "its error is above)")
        return Rank(int(reply), status)


def machine_rank(argv: list[str], env: dict[str, str], log_path: Path, *, target: str = LAUNCH,
                 cwd: Path | None = None, vllm: bool = False) -> subprocess.Popen[bytes]:
    """The rank `start_rank` describes, forked by the machine's rank server: the process returned is
    the client standing in for it (signals relayed, the rank's exit code; killed, the rank with it).
    Returns once the server serves (started and its imports done if it was not), so the rank starts
    at once, as from this process's own fork server; where no server can be had, the client runs the
    rank as its own interpreter."""
    env = {k: v for k, v in env.items() if k != rank_client.PRELOAD}
    if vllm:
        env[rank_client.PRELOAD] = "vllm"
    try:
        rank_client.ensure_server(env)
    except OSError:
        pass  # the client says why, in the rank's log, and runs the rank itself
    with open(log_path, "wb") as log:
        return subprocess.Popen([*rank_client.client_argv(), "-u", "-m", TARGET_MODULE, target, *argv], env=env,
                                cwd=cwd or os.getcwd(), stdin=subprocess.DEVNULL, stdout=log, stderr=log)


# A started rank: the machine's rank server's client, or a rank of this process's own fork server.
RankProcess = Rank | subprocess.Popen  # type: ignore[type-arg]


def _run_rank(request: dict[str, Any]) -> None:
    """In the forked child: become the rank the request describes; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        tempfile.tempdir = None  # TMPDIR as the rank's environment says, not as the server cached it
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        code = call(request["target"], request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  (the rank's log gets the traceback; the launcher the code)
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(vllm: bool) -> None:
    """The fork server: preload, then fork one rank per request line until stdin closes."""
    import gc

    from .job import preload

    preload(vllm=vllm)
    gc.collect()
    gc.freeze()  # a rank's collections skip the preloaded objects (a full one: 0.25 s less) and leave their pages shared
    children: dict[int, str] = {}

    def reap(signum: int, frame: object) -> None:
        for pid, code in reaped():
            path = children.pop(pid, None)
            if path is not None:
                tmp = f"{path}.tmp"
                Path(tmp).write_text(f"{code}\n")
                os.replace(tmp, path)

    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin:
        request = json.loads(line)
        # SIGCHLD waits until the child is in `children`, so an instant exit is still recorded
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        try:
            pid = os.fork()
            if pid == 0:
                _run_rank(request)
            children[pid] = request["status"]
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve(vllm=sys.argv[1:] == ["--vllm"])
