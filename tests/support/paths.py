"""Paths inside this checkout the tests read; nothing outside it (a fresh clone must pass)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"

# The two reference records of the system ggpo-batch re-creates: the schema contract (see tests/data/README.md).
SEED_000 = DATA / "000_b2e3fe1f0148d43c.txt"  # one experiment, 5 arms x 3 seeds
SEED_003 = DATA / "003_6402ffbf4ba21fea.txt"  # one nightly CPU component run

JOBS = REPO / "jobs"  # the checkout's example specs (exposure-5arm and demo-cpu are also packaged)
PACKAGED = REPO / "ggpo_batch" / "data"  # what the wheel ships (ggpo_batch/common/datafiles.py)
PROFILES = PACKAGED / "profiles"
DEV_CLUSTER_UP = REPO / "slurm" / "dev-cluster" / "up.sh"
# The dev cluster's state folder (slurm/dev-cluster/common.sh: pid files in run/, logs in log/).
DEV_CLUSTER_STATE = Path(os.environ.get("GGPO_SLURM_STATE", "/var/tmp/ggpo-slurm"))

# What tests/conftest.py sets for the whole run: one thread a process, one inductor and one vLLM
# cache. A test that gives a job a bare environment (its own HOME and TMPDIR, as an allocation's)
# keeps these, or the job compiles vLLM's CPU kernels and inspects its model classes again.
RUN_WIDE_ENV = ("OMP_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT")


def run_wide_env() -> dict[str, str]:
    return {k: os.environ[k] for k in RUN_WIDE_ENV if k in os.environ}
