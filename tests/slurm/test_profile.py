"""Cluster profiles: loading, validation errors that name file and field, mapping onto submitit."""

from __future__ import annotations

from pathlib import Path

import pytest
import submitit

from ggpo_batch.errors import SpecError
from ggpo_batch.executor.profile import load_profile
from tests.support.paths import PROFILES


def write(tmp_path: Path, text: str, name: str = "site") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def test_shipped_profiles_load_and_ask_for_four_gpus():
    default = load_profile("default", PROFILES)
    dev = load_profile("dev-cluster", PROFILES)
    assert default.gpus_per_node == dev.gpus_per_node == 4
    assert dev.partition == "dev"
    params = default.to_submitit_parameters()
    assert params["gpus_per_node"] == 4 and params["partition"] == "gpu" and params["mem"] == 256.0
    assert params["time"] == 120 and params["ntasks_per_node"] == 4


def test_parameters_are_accepted_by_submitit(tmp_path):
    prof = load_profile(write(tmp_path, 'partition = "p"\naccount = "acc"\nqos = "high"\nconstraint = "a100"\n'
                              'mem_gb = 1.5\nextra_sbatch = ["--exclusive", "--reservation=rl"]\nsetup = ["echo hi"]\n'),
                        tmp_path)
    text = submitit.slurm.slurm._make_sbatch_string(command="x", folder=tmp_path, **_native(prof.to_submitit_parameters()))
    for line in ("--account=acc", "--qos=high", "--constraint=a100", "--mem=1536MB", "--exclusive",
                 "--reservation=rl", "--gpus-per-node=4"):
        assert line in text
    assert "echo hi" in text
    auto = prof.to_auto_parameters()
    assert auto["gpus_per_node"] == 4 and auto["slurm_partition"] == "p" and auto["mem_gb"] == 1.5


def _native(params):
    params = dict(params)
    if "mem" in params:
        params["mem"] = submitit.slurm.slurm._convert_mem(params["mem"])
    return params


@pytest.mark.parametrize(
    "text, field, words",
    [
        ("gpus_per_node = -1\n", "gpus_per_node", ">= 0"),
        ('gpus_per_node = "4"\n', "gpus_per_node", "expected int"),
        ("tasks_per_node = true\n", "tasks_per_node", "boolean"),
        ("partitoin = 'gpu'\n", "partitoin", "unknown profile key"),
        ("partition = 'gpu; rm -rf /'\n", "partition", "misread"),
        ("extra_sbatch = ['--exclusive', 'rm -rf /']\n", "extra_sbatch[1]", "--flag"),
        ("extra_sbatch = ['--comment=x']\n", "extra_sbatch[0]", "set by the profile"),
        ('setup = ["a\\nb"]\n', "setup[0]", "one line"),
        ("schema = 7\n", "schema", "not supported"),
        ("partition = [\n", "", "not valid TOML"),
    ],
)
def test_errors_name_file_and_field(tmp_path, text, field, words):
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as exc:
        load_profile(path, tmp_path)
    assert exc.value.path == str(path)
    assert exc.value.field == field
    assert words in exc.value.message


def test_unknown_profile_name_lists_known_ones():
    with pytest.raises(SpecError, match=r"no such Slurm profile in .*profiles \(known: default, dev-cluster"):
        load_profile("nope", PROFILES)
    with pytest.raises(SpecError, match="not a Slurm profile name"):
        load_profile("a b", PROFILES)
