"""A rank forked by the machine's rank server, which has imported torch, DeepSpeed and the trainer.

The local executor's ranks and a local run's (`train_local`) start as `<python> -S rank_client.py
-u -m MODULE ARGS` (standard library only, no site: it starts in milliseconds): submitit's local
controller runs its ranks' `<python> -u -m submitit.core._submit FOLDER` with this script as
`<python>` (`command()`), and train/run/rankfork.py starts a local run's ranks through it. It asks
the machine's rank server (executor/rank_server.py) to fork the rank with this process's arguments,
environment, working directory and standard streams (passed as file descriptors), then stands in
for it: the signals sent to it (USR2 before the time limit, TERM, INT, QUIT, ...) are relayed to the
rank, and it exits as the rank did (the same code, or killed by the same signal). If this process
dies (SIGKILL), the server kills the rank. Those imports cost about 5 CPU-seconds a rank, paid here
once per server instead of in every rank of every job.

One server per user, Python, import-time environment (common/import_env.py), preload (`PRELOAD`:
`vllm` for ranks with vLLM rollouts, which then import vLLM too) and state of the code (the
package's sources, the installed libraries): a server never serves code that changed after it
imported it. It is started on first use, in a session of its own (no process group of the job's
holds it), and ends after `GGPO_RANK_SERVER_IDLE_SECONDS` (default 600) without a live rank. Where
no server can be had, the rank runs as its own interpreter (exec), with one line saying why.
`GGPO_RANK_SERVER=off` runs every rank that way.

Standard library only, and in `common` so that both the executor and the trainer's local runs start
ranks through it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import signal
import socket
import struct
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
SERVER_MODULE = "ggpo_batch.executor.rank_server"
SWITCH = "GGPO_RANK_SERVER"
IDLE_SETTING = "GGPO_RANK_SERVER_IDLE_SECONDS"
# What a server imports besides torch, DeepSpeed and the trainer: "vllm" (for ranks with vLLM
# rollouts) or nothing. Part of the server's key; the server reads it from its environment.
PRELOAD = "GGPO_RANK_SERVER_PRELOAD"
DEFAULT_IDLE_SECONDS = 600.0
# Waiting for a server to import (about 5 s alone, a minute on a loaded 2-core machine).
START_TIMEOUT_S = 300.0
# Signals the controller (or a user) sends a rank: relayed to it.
RELAYED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGQUIT,
           signal.SIGCONT)
HEADER = struct.Struct("!I")


def _import_env_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("_ggpo_import_env", PACKAGE / "common" / "import_env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enabled(env: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return env.get(SWITCH, "on").strip().lower() not in ("0", "off", "no", "false")


def client_argv() -> list[str]:
    """This script, run without site (fast): what starts a rank in place of `python`."""
    return [sys.executable, "-S", str(Path(__file__).resolve())]


def command() -> str:
    """What the local executor gives submitit as `python` (`client_argv`, as one shell string)."""
    import shlex

    return " ".join(shlex.quote(part) for part in client_argv())


def servers_dir() -> Path:
    """This user's folder of server sockets (mode 0700, refused if another user owns it)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or "/tmp")
    folder = base / f"ggpo-rank-servers-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat()
    if not folder.is_dir() or folder.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{folder} is not a folder of this user's alone (mode 0700)")
    return folder


def code_stamp(package: Path = PACKAGE) -> list[int]:
    """The newest modification of the package's sources and of the installed libraries' folder
    (pip adds and removes entries there)."""
    newest = 0
    for root, _dirs, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                with contextlib.suppress(OSError):
                    newest = max(newest, os.stat(os.path.join(root, name)).st_mtime_ns)
    try:
        installed = os.stat(libraries_dir()).st_mtime_ns
    except OSError:
        installed = 0
    return [newest, installed]


def libraries_dir() -> str:
    """This Python's installed libraries (site-packages), the same with or without `-S`: without site,
    a virtual environment's interpreter keeps the base Python's prefix (site.py sets the venv's), and
    a launcher (site loaded) must compute the same key as its ranks' clients (`-S`)."""
    if sys.flags.no_site:
        venv = Path(sys.executable).parent.parent
        if (venv / "pyvenv.cfg").is_file():
            return sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    return sysconfig.get_paths()["purelib"]


def server_key(env: dict[str, str]) -> str:
    """Which server may fork a rank of this environment and this code."""
    wanted = {"python": sys.executable, "env": _import_env_module().import_time_env(env), "code": code_stamp()}
    if env.get(PRELOAD):
        wanted["preload"] = env[PRELOAD]
    return hashlib.sha256(json.dumps(wanted, sort_keys=True).encode()).hexdigest()[:20]


# The longest path a Unix socket's address holds (sun_path is 108 bytes on Linux, with its NUL).
SUN_PATH_MAX = 107


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """The address to bind or connect `path` by: the path itself, or, where it is too long for a
    socket's address (a deep XDG_RUNTIME_DIR), its name, from inside its folder for the call."""
    if len(os.fsencode(str(path))) <= SUN_PATH_MAX:
        yield str(path)
        return
    before = os.open(".", os.O_RDONLY)
    try:
        os.chdir(path.parent)
        yield path.name
    finally:
        os.fchdir(before)
        os.close(before)


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(path) as address:
            sock.connect(address)
    except OSError:
        sock.close()
        return None
    return sock


def _start_server(path: Path, env: dict[str, str]) -> int:
    """Start a server bound to `path`, detached (double fork: never a child of this job's tree);
    the server's pid."""
    log = path.with_suffix(".log")
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(read_end)
            os.setsid()
            second = os.fork()
            if second == 0:
                os.chdir("/")
                fd = os.open(os.devnull, os.O_RDONLY)
                os.dup2(fd, 0)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                os.dup2(out, 1)
                os.dup2(out, 2)
                os.closerange(3, 1 << 16)
                os.execve(sys.executable, [sys.executable, "-m", SERVER_MODULE, str(path)], env)
            os.write(write_end, f"{second}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(first, 0)
    return int(said) if said.isdigit() else 0


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not: it will never write a result)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def connect_or_start(env: dict[str, str]) -> socket.socket:
    """A connection to the server for `env` and this code, started if there is none."""
    folder = servers_dir()
    path = folder / f"{server_key(env)}.sock"
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one starter; the others find its server
        sock = _connect(path)
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a server that ended without removing it
        pid = _start_server(path, env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if not pid or not alive(pid):
                break
            time.sleep(0.05)
    raise OSError(f"the rank server did not start (see {path.with_suffix('.log')})")


def ensure_server(env: dict[str, str]) -> None:
    """Start the server for `env` and this code unless it runs, and wait until it serves (its imports
    done); raises OSError where none could be started. A launcher that times its ranks from their
    start calls this first."""
    connect_or_start(env).close()


class Relay:
    """Signals that arrive before the rank's pid is known are kept, then sent."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        for signum in RELAYED:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        if self.pid is None:
            self.pending.append(signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def rank_started(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        self.pending.clear()


def _read_line(sock: socket.socket, buffer: bytearray) -> str | None:
    while b"\n" not in buffer:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


def run_forked(argv: list[str], relay: Relay) -> int:
    """Have the server fork the rank `python <argv>` and stand in for it, relaying signals through
    `relay`; the rank's exit code (negative: killed by that signal). Raises OSError where no server
    could fork it."""
    env = dict(os.environ)
    sock = connect_or_start(env)
    with sock:
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(sock, [HEADER.pack(len(request))], [0, 1, 2])
        sock.sendall(request)
        buffer = bytearray()
        line = _read_line(sock, buffer)
        if line is None or not line.startswith("pid "):
            raise OSError(f"the rank server did not fork the rank ({line or 'it closed the connection'})")
        relay.rank_started(int(line[4:]))
        line = _read_line(sock, buffer)
    if line is None or not line.startswith("exit "):
        print("rank_client: the rank server ended while the rank ran", file=sys.stderr, flush=True)
        return 1
    return int(line[5:])


def _exit_as(code: int) -> None:
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def main() -> None:
    argv = sys.argv[1:]
    if enabled():
        relay = Relay()
        try:
            _exit_as(run_forked(argv, relay))
        except OSError as exc:
            for signum in RELAYED:
                signal.signal(signum, signal.SIG_DFL)
            # told to stop while asking (the controller ending the job): stop, as the rank would have
            stop = [s for s in relay.pending if s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)]
            if stop:
                _exit_as(-stop[0])
            print(f"rank_client: {exc}; the rank starts on its own", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, *argv])


if __name__ == "__main__":
    main()
