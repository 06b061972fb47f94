"""The local executor's ranks, forked by a rank server (common/rank_client.py, executor/rank_server.py).

Each test runs the real client script, as submitit's local controller does (`python -S
rank_client.py -u -m MODULE ARGS`), against a real server in a folder of this module's own; the
rank is tests/support/rank_probe.py, or a submitit job. The module's server is started once (its
imports are the ~5 CPU-seconds it saves each rank) and the last test sees it end when idle.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from ggpo_batch.common import rank_client
from ggpo_batch.common.rank_client import alive
from tests.support.paths import REPO
from tests.support.rank_servers import processes
from tests.support.waiting import wait_until

CLIENT = Path(rank_client.__file__).resolve()
IDLE_SECONDS = 12


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of this module's clients: their servers in a folder of their own."""
    runtime = tmp_path_factory.mktemp("runtime")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(XDG_RUNTIME_DIR=str(runtime), GGPO_RANK_SERVER_IDLE_SECONDS=str(IDLE_SECONDS),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    yield env
    for pid in _server_pids(runtime):  # a test that failed before the server went idle
        _kill(pid)


def _server_pids(runtime: Path) -> list[int]:
    """The module's servers under `runtime`, and any rank one forked (it carries its server's command line)."""
    return [pid for pid, _ppid, cmd in processes()
            if rank_client.SERVER_MODULE.encode() in cmd and str(runtime).encode() in cmd]


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _client(args: list[str], env: dict[str, str], **kw) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run([sys.executable, "-S", str(CLIENT), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=300, **kw)


def _probe(what: list[str]) -> list[str]:
    return ["-u", "-m", "tests.support.rank_probe", *what]


def test_a_rank_is_forked_by_the_server_in_the_clients_streams_arguments_environment_and_folder(servers):
    first = _client(_probe(["report"]), {**servers, "GGPO_PROBE": "one"})
    assert first.returncode == 0, first.stderr
    second = _client(_probe(["report"]), {**servers, "GGPO_PROBE": "two"})
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["ppid"] == b["ppid"] and a["pid"] != b["pid"]  # both forked by one server
    server = Path(f"/proc/{a['ppid']}/cmdline").read_bytes()
    assert b"ggpo_batch.executor.rank_server" in server
    assert (a["probe"], b["probe"]) == ("one", "two")  # each rank in its own client's environment
    assert a["cwd"] == str(REPO) and a["argv"] == ["report"]
    assert first.stderr.strip() == "on stderr"


def test_the_client_exits_as_its_rank_did(servers):
    assert _client(_probe(["exit", "3"]), servers).returncode == 3
    assert _client(_probe(["die", str(int(signal.SIGTERM))]), servers).returncode == -signal.SIGTERM
    assert _client(_probe(["die", str(int(signal.SIGKILL))]), servers).returncode == -signal.SIGKILL


def _started(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-S", str(CLIENT), *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready "), line
    return proc, int(line.split()[1])


def test_signals_reach_the_rank_and_a_killed_client_takes_its_rank_with_it(servers, tmp_path: Path):
    # the controller's time-limit signal (USR2) reaches the rank, which answers as it would alone
    said = tmp_path / "said"
    proc, rank = _started(_probe(["wait", str(said)]), servers)
    assert rank != proc.pid
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(timeout=60) == 7
    assert said.read_text() == "usr2"
    # the controller's SIGKILL, which no process can relay: the server sees its client gone
    proc, rank = _started(_probe(["sleep"]), servers)
    assert alive(rank)
    proc.kill()
    proc.wait(timeout=30)
    wait_until(lambda: not alive(rank), 30, "the rank killed with its client")


def test_without_a_server_the_rank_runs_as_submitit_would_have_run_it(servers):
    # switched off: the client becomes the rank (exec), so the rank's parent is this test
    off = _client(_probe(["report"]), {**servers, "GGPO_RANK_SERVER": "off"})
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["ppid"] == os.getpid()
    # a command the server does not run (not `python -m MODULE`): refused, and run on its own, saying so
    alone = _client(["-c", "import os; print(os.getppid())"], servers)
    assert alone.returncode == 0, alone.stderr
    assert int(alone.stdout) == os.getpid()
    assert "not a `python -m MODULE` command" in alone.stderr and "starts on its own" in alone.stderr


def test_a_server_serves_only_its_import_time_environment_and_its_code(tmp_path: Path):
    base = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1"}
    assert rank_client.server_key(base) == rank_client.server_key({**base, "GGPO_PROBE": "x"})
    assert rank_client.server_key(base) != rank_client.server_key({**base, "OMP_NUM_THREADS": "2"})
    assert rank_client.server_key(base) != rank_client.server_key({**base, "PYTHONPATH": "/elsewhere"})
    # a server that imported vLLM as well serves ranks with vLLM rollouts (train/run/rankfork.py)
    assert rank_client.server_key(base) != rank_client.server_key({**base, rank_client.PRELOAD: "vllm"})
    # a launcher (site loaded) finds the server its ranks' clients (`python -S`) will ask: in a venv,
    # -S leaves the base Python's prefix, and the libraries' stamp was the base Python's
    client = ("import importlib.util as u, json, sys; s = u.spec_from_file_location('c', sys.argv[1]); "
              "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.server_key(json.loads(sys.argv[2])))")
    said = subprocess.run([sys.executable, "-S", "-c", client, str(CLIENT), json.dumps(base)], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert said == rank_client.server_key(base)
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    source = package / "sub" / "mod.py"
    source.write_text("x = 1\n")
    before = rank_client.code_stamp(package)
    later = source.stat().st_mtime + 5
    os.utime(source, (later, later))  # an edited source: a server that imported the old one must not serve
    assert rank_client.code_stamp(package) != before


def _parent_command() -> str:
    return Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_local_submitit_job_runs_in_ranks_forked_by_the_server(servers, tmp_path: Path, monkeypatch):
    import submitit

    for key, value in servers.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO)
    ex = submitit.LocalExecutor(folder=tmp_path / "job", python=rank_client.command())
    ex.update_parameters(tasks_per_node=2, timeout_min=5)
    job = ex.submit(_parent_command)
    results = job.results()
    assert len(results) == 2 and all("ggpo_batch.executor.rank_server" in r for r in results), results


def test_clients_at_once_share_one_new_server_and_a_killed_server_takes_its_ranks(servers, tmp_path: Path):
    """Four ranks asking at once where no server runs: one starts it (under a lock), all four are
    its children. Its folder is deeper than a socket's address holds (107 bytes): bound and reached
    by name from inside it. Then the server is SIGKILLed with the four running: they end with it (parent-death
    signal) and each client exits 1, saying so, instead of waiting for ever."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    env = {**servers, "XDG_RUNTIME_DIR": str(runtime)}
    procs = [subprocess.Popen([sys.executable, "-S", str(CLIENT), *_probe(["sleep"])], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        ranks = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("ready "), (line, proc.stderr.read() if proc.poll() is not None else "")
            ranks.append(int(line.split()[1]))
        [server] = set(_server_pids(runtime)) - set(ranks)  # a forked rank has its server's command line
        parents = {pid: ppid for pid, ppid, _cmd in processes()}
        assert all(parents[rank] == server for rank in ranks)
        os.kill(server, signal.SIGKILL)
        for proc in procs:
            assert proc.wait(timeout=60) == 1
            assert "the rank server ended while the rank ran" in (proc.stderr.read() if proc.stderr else "")
        wait_until(lambda: not any(alive(rank) for rank in ranks), 30, "the ranks ended with their server")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for pid in _server_pids(runtime):
            _kill(pid)


def test_an_idle_server_ends_and_removes_its_socket(servers):
    """Each of the module's servers ends once idle for its IDLE_SECONDS, not before, and removes its socket.

    Read from their logs, not from whether one still runs when this test starts: on a loaded machine
    the tests in between can take longer than the idle time (a full run saw the server gone).
    """
    runtime = Path(servers["XDG_RUNTIME_DIR"])
    used = _client(_probe(["report"]), servers)  # the module's server, or a new one where it ended
    assert used.returncode == 0, used.stderr
    wait_until(lambda: not _server_pids(runtime) and not list(runtime.glob("*/*.sock")), IDLE_SECONDS + 60,
               "the idle servers ended")
    logs = list(runtime.glob("*/*.log"))
    assert logs
    for log in logs:  # one per server key, a server after another appending to it
        stamped = [(datetime.fromisoformat(line[:19]), line[20:].split(": ", 1)[1])
                   for line in log.read_text().splitlines()]
        said = [text for _at, text in stamped]
        assert said[-2:] == ["idle", "ended"], said
        busy = [at for at, text in stamped if text.startswith(("ready on", "rank "))]
        idle_at = stamped[-2][0]
        assert (idle_at - max(busy)).total_seconds() >= IDLE_SECONDS - 1, said  # the log stamps whole seconds
