"""The machine's rank server: imports torch, DeepSpeed and the trainer once (with
GGPO_RANK_SERVER_PRELOAD=vllm, vLLM too), then forks each rank that common/rank_client.py asks for,
for the local executor's jobs and for local runs (why, and the server's life, are told there).

`python -m ggpo_batch.executor.rank_server SOCKET [IDLE_SECONDS]`. One thread, always: a fork
copies a consistent process. The server never runs torch itself; ranks are CPU-only (the local
executor gives no GPU), so no CUDA state crosses a fork. Each rank:

- runs `python [-u] -m MODULE ARGS` as that command would (`runpy`, `__main__`), in the client's
  environment, working directory and standard streams (received as file descriptors);
- is a process group of its own, killed (SIGKILL) when its client's connection closes (the
  controller killed it), and ends with the server (parent-death signal);
- ends as an interpreter ends (threads joined, exit handlers run); the server sends its client the
  exit code (negative: the signal that killed it).
"""

from __future__ import annotations

import gc
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..common.rank_client import (
    DEFAULT_IDLE_SECONDS,
    HEADER,
    IDLE_SETTING,
    PRELOAD,
    socket_address,
)
from ..common.reaping import reaped

MAX_REQUEST_BYTES = 16 << 20
# The server's `python -m` put its own working directory first on sys.path; a rank's is its client's.
SERVER_PATH0 = sys.path[0] if sys.path else ""
# How often an idle server checks that its socket file is still its own.
CHECK_EVERY_S = 30.0


def _log(text: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} rank server {os.getpid()}: {text}", flush=True)


def _module_and_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """`[-u] -m MODULE ARGS...` -> (MODULE, ARGS); None for any other command line."""
    rest = argv[1:] if argv[:1] == ["-u"] else argv
    if len(rest) >= 2 and rest[0] == "-m" and rest[1] and not rest[1].startswith("-"):
        return rest[1], rest[2:]
    return None


def _become_rank(request: dict[str, Any], fds: list[int], server_pid: int, keep_out: list[Any]) -> None:
    """In the forked child: run the rank the request describes; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for obj in keep_out:  # the server's listener, wake-up pipe and other clients' connections
            if isinstance(obj, int):
                os.close(obj)
            else:
                obj.close()
        os.setpgid(0, 0)
        from ..common.parent_death import signal_at_parent_death

        signal_at_parent_death(signal.SIGKILL)
        if os.getppid() != server_pid:
            os._exit(1)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        import io

        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        # `python -u`: nothing waits in a buffer when the rank is killed
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                      errors="backslashreplace", write_through=True)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import tempfile

        tempfile.tempdir = None  # TMPDIR as the rank's environment says, not as the server cached it
        if "OMP_NUM_THREADS" in os.environ:
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if sys.path and sys.path[0] == SERVER_PATH0:  # `python -m` looks in its working directory first
            sys.path[0] = request["cwd"]
        module, args = request["module"], request["args"]
        sys.argv = [module, *args]
        import runpy

        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (as an interpreter would: the traceback, exit 1)
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # as at the end of an interpreter
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    import json

    conn.settimeout(10.0)
    head, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 3)
    if not head and not fds:
        raise EOFError  # a client that only made sure this server is up (rank_client.ensure_server)
    try:
        while len(head) < HEADER.size:
            more = conn.recv(HEADER.size - len(head))
            if not more:
                raise ValueError("the request ended early")
            head += more
        (size,) = HEADER.unpack(head)
        if size > MAX_REQUEST_BYTES or len(fds) != 3:
            raise ValueError(f"a request of {size} bytes with {len(fds)} descriptors")
        body = bytearray()
        while len(body) < size:
            more = conn.recv(min(1 << 16, size - len(body)))
            if not more:
                raise ValueError("the request ended early")
            body += more
        request = json.loads(body)
        parsed = _module_and_args(list(request["argv"]))
        if parsed is None:
            raise ValueError(f"not a `python -m MODULE` command: {request['argv']!r}")
        request["module"], request["args"] = parsed
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _preload() -> None:
    from . import payload

    if not payload.preload_payloads(vllm=os.environ.get(PRELOAD) == "vllm"):
        raise SystemExit("the train extra is not installed: nothing to preload")
    import submitit.core.submission  # noqa: F401  (the ranks' entry point)

    from ..train.run import canary, eval_job, job  # noqa: F401  (what the payloads unpickle)


def serve(path: Path, idle_seconds: float) -> None:
    started = time.monotonic()
    _preload()
    gc.collect()
    gc.freeze()  # the ranks' collections leave the preloaded objects' pages shared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with socket_address(path) as address:
        listener.bind(address)
    mine = os.stat(path).st_ino
    listener.listen(64)  # a client that connects from now on is served
    _log(f"ready on {path} after {time.monotonic() - started:.1f} s of imports")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, _stop)  # ended from outside: its socket goes with it (its ranks too)
    try:
        _loop(listener, wake_r, wake_w, path, mine, idle_seconds)
    finally:
        if _still_ours(path, mine):
            path.unlink(missing_ok=True)
    _log("ended")


def _still_ours(path: Path, mine: int) -> bool:
    """Whether the socket file at `path` is still the one this server bound (inode `mine`), not
    removed or replaced by a newer server."""
    try:
        return os.stat(path).st_ino == mine
    except OSError:
        return False


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)


def _loop(listener: socket.socket, wake_r: int, wake_w: int, path: Path, mine: int, idle_seconds: float) -> None:
    """Serve until idle for `idle_seconds` or the socket file is no longer this server's."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    ranks: dict[int, socket.socket | None] = {}  # rank pid -> its client's connection (None: gone)
    busy_until = time.monotonic()
    while True:
        now = time.monotonic()
        if ranks:
            busy_until = now
        elif now >= busy_until + idle_seconds or not _still_ours(path, mine):
            break
        timeout = None if ranks else min(CHECK_EVERY_S, busy_until + idle_seconds - now)
        for key, _ in selector.select(timeout):
            if key.fileobj is listener:
                conn, _addr = listener.accept()
                try:
                    request, fds = _read_request(conn)
                except EOFError:
                    conn.close()
                    continue
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    _log(f"refused a request: {exc}")
                    try:
                        conn.sendall(f"refused {exc}\n".encode())
                    except OSError:
                        pass
                    conn.close()
                    continue
                keep_out = [listener, wake_r, wake_w, conn, *(c for c in ranks.values() if c is not None)]
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _become_rank(request, fds, os.getppid(), keep_out)
                for fd in fds:
                    os.close(fd)
                ranks[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
                _log(f"rank {pid}: {request['module']} {' '.join(request['args'])}")
                try:
                    conn.sendall(f"pid {pid}\n".encode())
                except OSError:
                    pass  # its client is gone: the read below sees it
            elif key.fileobj is wake_r:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            else:
                conn, pid = key.fileobj, key.data
                try:
                    said = conn.recv(64)
                except OSError:
                    said = b""
                if not said:  # the client died (the controller killed it): so does its rank
                    selector.unregister(conn)
                    conn.close()
                    ranks[pid] = None
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    _log(f"rank {pid}: its client is gone, killed")
        _reap(ranks, selector)
    _log("idle")


def _reap(ranks: dict[int, socket.socket | None], selector: selectors.BaseSelector) -> None:
    for pid, code in reaped():
        conn = ranks.pop(pid, None)
        _log(f"rank {pid}: exit {code}")
        if conn is not None:
            selector.unregister(conn)
            try:
                conn.sendall(f"exit {code}\n".encode())
            except OSError:
                pass
            conn.close()


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python -m ggpo_batch.executor.rank_server SOCKET [IDLE_SECONDS]")
    try:
        idle = float(sys.argv[2] if len(sys.argv) == 3 else os.environ.get(IDLE_SETTING, DEFAULT_IDLE_SECONDS))
    except ValueError:
        raise SystemExit(f"{IDLE_SETTING} must be a number of seconds") from None
    serve(Path(sys.argv[1]), idle)


if __name__ == "__main__":
    main()
