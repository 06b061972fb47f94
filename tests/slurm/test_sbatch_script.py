"""The sbatch script the executor writes, compared with a saved copy (as submitit's own tests do).

If a change to the profile mapping or to submitit changes the script on purpose, delete
tests/slurm/data/sbatch_dev_cluster.txt and run this test once to write the new copy; review the diff.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ggpo_batch.executor.base import job_name
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.executor.slurm import SlurmExecutor, job_comment
from tests.support.paths import PROFILES

RECORD = Path(__file__).parent / "data" / "sbatch_dev_cluster.txt"

# submitit's SlurmExecutor refuses to exist where there is no srun
pytestmark = pytest.mark.skipif(shutil.which("srun") is None, reason="no srun: run slurm/dev-cluster/up.sh")


def test_script_matches_saved_copy():
    profile = load_profile("dev-cluster", PROFILES)
    ex = SlurmExecutor(profile, Path("/logs"), python="python3")
    key = "20261012/paired"
    text = ex.submission_script(job_name(key, 2), job_comment(key, 2), Path("/logs/20261012_paired/a2"))
    if not RECORD.exists():
        RECORD.write_text(text)
    changes = [f"line {i + 1}: {b!r} -> {a!r}" for i, (a, b) in
               enumerate(zip(text.splitlines(), RECORD.read_text().splitlines())) if a != b]
    assert len(text.splitlines()) == len(RECORD.read_text().splitlines()), text
    assert not changes, "\n".join(changes + [f"(rm {RECORD} if this is intended)"])
    for line in ("#SBATCH --gpus-per-node=4", "#SBATCH --job-name=ggpo.20261012_paired.a2",
                 "#SBATCH --comment=ggpo:20261012/paired:2", "#SBATCH --partition=dev", "#SBATCH --time=10"):
        assert line in text.splitlines()


def test_hostile_values_never_reach_the_script():
    profile = load_profile("dev-cluster", PROFILES)
    ex = SlurmExecutor(profile, Path("/logs"), python="python3")
    key = "x'\n#SBATCH --gpus-per-node=99\n$(reboot)"
    text = ex.submission_script(job_name(key, 0), job_comment(key, 0), Path("/logs/x"))
    assert "$(" not in text and "'" not in text  # nothing a shell or sbatch's parser would act on
    assert len(text.splitlines()) == len(RECORD.read_text().splitlines())
    assert sum(1 for line in text.splitlines() if line.startswith("#SBATCH --gpus-per-node")) == 1


def test_two_node_profile_asks_for_nodes_with_one_task_per_gpu_on_each():
    profile = load_profile("dev-cluster-2node", PROFILES)
    ex = SlurmExecutor(profile, Path("/logs"), python="python3")
    lines = ex.submission_script(job_name("k", 1), job_comment("k", 1), Path("/logs/k/a1")).splitlines()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2"):
        assert line in lines, lines
    # the saved one-node script differs from this one only in those lines
    saved = RECORD.read_text().splitlines()
    assert "#SBATCH --nodes=1" in saved and len(saved) == len(lines)
