"""Fixtures for tests against the real single-node Slurm of slurm/dev-cluster (`dev_cluster` and
`tag` are in tests/conftest.py: the Slurm fault tests use them too)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.executor.profile import SlurmProfile, load_profile
from ggpo_batch.executor.sacct import Sacct
from ggpo_batch.executor.slurm import SlurmExecutor
from tests.support.paths import PROFILES
from tests.support.slurm import CountingRunner, cancel_tagged


@pytest.fixture
def profile() -> SlurmProfile:
    return load_profile("dev-cluster", PROFILES)


@pytest.fixture
def runner() -> CountingRunner:
    return CountingRunner()


@pytest.fixture
def executor(dev_cluster, profile, runner, tmp_path, tag):
    ex = SlurmExecutor(profile, tmp_path / "slurm", sacct=Sacct(runner=runner), runner=runner, min_submit_interval_s=0)
    yield ex
    cancel_tagged(tag)  # whatever this test left in the queue


# -- ledger + queue fixtures for the end-to-end tests (the root conftest's Redis db) --


@pytest.fixture
def db_url(tmp_path: Path):  # overrides tests/conftest.py: the Slurm side is backend-neutral, SQLite suffices
    yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
