"""A local run's ranks (ggpo_batch/train/run/rankfork.py), forked by the machine's rank server or by a
fork server of the launching process's own: a forked rank gets its own environment, folder, temp dir
and log, and its exit status comes back even when it exits at once or is killed."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from ggpo_batch.common.rank_client import alive
from ggpo_batch.train.run.rankfork import ForkServer
from tests.support.paths import REPO

pytestmark = pytest.mark.train

HERE = "tests.train.test_rankfork"


def report(argv: list[str]) -> int:
    """A rank that says what it sees, then exits with code argv[0] (0: returns None)."""
    print(f"cwd={os.getcwd()} tmp={tempfile.gettempdir()} marker={os.environ.get('GGPO_FORK_MARKER')} "
          f"sys.argv={sys.argv[1:]} torch={'torch' in sys.modules}")
    return int(argv[0]) or None  # type: ignore[return-value]


def starts(argv: list[str]) -> None:
    """A rank that does what a training rank does before its first step, then writes the modules
    that took it to argv[0]."""
    from tools.bench.rank_time_imports import rank_start

    before = set(sys.modules)
    rank_start()
    Path(argv[0]).write_text("\n".join(sorted(set(sys.modules) - before)))


def sleeper(argv: list[str]) -> None:
    print(f"sleeping {os.getpid()}", flush=True)
    signal.pause()


# A rank is forked by the machine's rank server (the default), or, with it switched off, by a fork
# server of the launching process's own.
SERVERS = {"machine": "on", "own": "off"}


@pytest.mark.parametrize("server", SERVERS)
def test_a_forked_rank_has_its_environment_folder_and_exit_code(tmp_path: Path, server: str):
    (tmp_path / "t").mkdir()
    env = dict(os.environ, GGPO_FORK_MARKER="m1", TMPDIR=str(tmp_path / "t"), GGPO_RANK_SERVER=SERVERS[server])
    # its entry point is this module, found from the rank's folder as `python -m` would: on its path
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    ranks = [ForkServer.start_rank([str(code)], env, tmp_path / f"r{code}.log", target=f"{HERE}:report", cwd=tmp_path)
             for code in (0, 3)]
    assert [r.wait(timeout=60) for r in ranks] == [0, 3]  # both exit at once: neither status is lost
    log = (tmp_path / "r3.log").read_text()
    # torch=True: forked from a server that had imported it
    assert f"cwd={tmp_path} tmp={tmp_path / 't'} marker=m1 sys.argv=['3'] torch=True" in log, log


def test_a_forked_rank_imports_nothing_heavy_before_its_first_step(tmp_path: Path):
    """The fork server's preload took what DeepSpeed imports in `deepspeed.initialize` (its Muon
    optimizer, uncompiled: no torch._inductor) and the trainer's own late imports: a rank pays none
    of them (tools/bench/rank_time_imports.py)."""
    rank = ForkServer.start_rank([str(tmp_path / "new")], dict(os.environ), tmp_path / "r.log", target=f"{HERE}:starts")
    assert rank.wait(timeout=120) == 0, (tmp_path / "r.log").read_text()
    new = (tmp_path / "new").read_text().split()
    heavy = [m for m in new if m.startswith(("torch._dynamo", "torch._inductor", "deepspeed.runtime.zero.muon",
                                             "bm25s", "ggpo_batch.train.pretrained"))]
    assert heavy == [], heavy


def _sleeping(rank, log: Path) -> int:  # type: ignore[no-untyped-def]
    """The pid of a started `sleeper` rank, once it sleeps."""
    deadline = time.monotonic() + 60
    while not (log.exists() and "sleeping" in log.read_text()):
        assert rank.poll() is None and time.monotonic() < deadline, log.read_text() if log.exists() else ""
        time.sleep(0.1)
    return int(log.read_text().split("sleeping ", 1)[1].split()[0])


@pytest.mark.parametrize("server", SERVERS)
def test_a_killed_rank_reports_its_signal(tmp_path: Path, server: str):
    """Killed, a rank exits -SIGKILL; a rank of the machine's server is killed through the client
    that stands in for it (train_local kills what it started), and ends with it."""
    log = tmp_path / "s.log"
    rank = ForkServer.start_rank([], dict(os.environ, GGPO_RANK_SERVER=SERVERS[server]), log, target=f"{HERE}:sleeper")
    pid = _sleeping(rank, log)
    assert (pid == rank.pid) is (server == "own")  # else the server's child, not the client
    rank.kill()
    assert rank.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while alive(pid):
        assert time.monotonic() < deadline, f"rank {pid} outlived its client"
        time.sleep(0.1)


def test_a_changed_import_environment_gets_an_own_fork_server_of_its_own(tmp_path: Path):
    """With the machine's rank server off: a launching process keeps one fork server per import-time
    environment (the machine's servers are keyed the same way: tests/test_rank_server.py)."""
    env = dict(os.environ, GGPO_RANK_SERVER="off")
    assert ForkServer.start_rank(["0"], env, tmp_path / "a.log", target=f"{HERE}:report").wait(timeout=60) == 0
    first = ForkServer._servers[ForkServer.key(env, vllm=False)]
    # OMP_NUM_THREADS is read when torch is imported: a request that changes it needs another server
    other_env = dict(env, OMP_NUM_THREADS="2")
    assert ForkServer.start_rank(["0"], other_env, tmp_path / "o.log", target=f"{HERE}:report").wait(timeout=60) == 0
    other = ForkServer._servers[ForkServer.key(other_env, vllm=False)]
    assert other is not first and first.proc.poll() is None  # the first is kept for its own environment
