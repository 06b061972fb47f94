"""Fixtures for tests against the real single-node Slurm of slurm/dev-cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import cloudpickle
import pytest

from ggpo_batch.executor.base import JobInfo
from ggpo_batch.executor.profile import SlurmProfile, load_profile
from ggpo_batch.executor.sacct import Sacct, run_command
from ggpo_batch.executor.slurm import SlurmExecutor

from . import jobs

REPO = Path(__file__).resolve().parents[2]
UP = REPO / "slurm" / "dev-cluster" / "up.sh"
PROFILES = REPO / "slurm" / "profiles"

# The job callables are defined here, not in an installed module: ship them by value.
cloudpickle.register_pickle_by_value(jobs)


@pytest.fixture(scope="session")
def dev_cluster() -> None:
    """Start (or reuse) the dev Slurm once per session; skip only if Slurm cannot be installed."""
    if os.geteuid() != 0:
        pytest.skip("the dev Slurm needs root (slurm/dev-cluster/up.sh)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed and apt-get is not available to install it")
    proc = subprocess.run(["bash", str(UP)], capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        if "apt-get install" in proc.stderr and shutil.which("slurmctld") is None:
            pytest.skip(f"Slurm cannot be installed here: {proc.stderr.strip()[-300:]}")
        pytest.fail(f"slurm/dev-cluster/up.sh failed:\n{proc.stdout}\n{proc.stderr}")


class CountingRunner:
    """The real command runner, with a record of every command it ran."""

    def __init__(self) -> None:
        self.argv: list[list[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.argv.append(list(argv))
        return run_command(argv)

    def count(self, program: str) -> int:
        return sum(1 for a in self.argv if a[0] == program)


@pytest.fixture
def profile() -> SlurmProfile:
    return load_profile("dev-cluster", PROFILES)


@pytest.fixture
def runner() -> CountingRunner:
    return CountingRunner()


@pytest.fixture
def tag() -> str:
    """A run-key prefix unique to this test, so old accounting rows never answer for new jobs."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def executor(dev_cluster, profile, runner, tmp_path, tag):
    ex = SlurmExecutor(profile, tmp_path / "slurm", sacct=Sacct(runner=runner), runner=runner, min_submit_interval_s=0)
    yield ex
    # cancel whatever this test left in the queue
    out = run_command(["squeue", "-h", "-o", "%i|%j"])
    for line in out.splitlines():
        job_id, _, name = line.partition("|")
        if tag in name:
            subprocess.run(["scancel", job_id.strip()], check=False)


def wait_for(ex: SlurmExecutor, job_id: str, done: Callable[[JobInfo], bool], timeout_s: float) -> JobInfo:
    """Poll sacct until `done(info)`; fail with the last state seen."""
    end = time.monotonic() + timeout_s
    info = None
    while time.monotonic() < end:
        info = ex.poll([job_id]).get(job_id)
        if info is not None and done(info):
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not get there in {timeout_s} s; last seen {info}")


def final(info: JobInfo) -> bool:
    return info.final


# -- ledger + queue fixtures for the end-to-end tests (SQLite ledger; Redis db 8 is this suite's) --

SLURM_REDIS_DB = 8


@pytest.fixture
def db_url(tmp_path: Path):  # overrides tests/conftest.py: the Slurm side is backend-neutral, SQLite suffices
    yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"


@pytest.fixture
def redis_url():  # overrides tests/conftest.py: Redis db 8, flushed before and after
    from ..conftest import flushed_redis

    yield from flushed_redis(SLURM_REDIS_DB)
