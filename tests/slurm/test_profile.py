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
        ("[priority.urgent]\nnice = 1\n", "priority.urgent", "unknown priority"),
        ("[priority.low]\nnice = -5\n", "priority.low.nice", ">= 0"),
        ("[priority.low]\nnice = 1.5\n", "priority.low.nice", "expected int"),
        ("[priority.high]\nqos = 'hi gh'\n", "priority.high.qos", "misread"),
        ("[priority.high]\npartition = 'x'\n", "priority.high.partition", "unknown key"),
        ("priority = 3\n", "priority", "must be a table"),
        ("extra_sbatch = ['--nice=5']\n", "extra_sbatch[0]", "set by the profile"),
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


def test_a_priority_maps_to_nice_and_qos_in_the_sbatch_script(tmp_path):
    """[priority.<p>] gives a run of that priority `--nice` and/or its own QoS on top of the profile's
    allocation; a priority the profile does not map adds nothing."""
    import shutil

    from ggpo_batch.executor.slurm import SlurmExecutor

    prof = load_profile(write(tmp_path, 'qos = "normal"\n[priority.high]\nqos = "urgent"\n[priority.low]\nnice = 10000\n'),
                        tmp_path)
    assert prof.priority_parameters("high") == {"qos": "urgent"}
    assert prof.priority_parameters("low") == {"nice": 10000}
    assert prof.priority_parameters("normal") == {}
    assert load_profile("dev-cluster", PROFILES).priority_parameters("low") == {"nice": 1000}
    if shutil.which("srun") is None:  # submitit's SlurmExecutor refuses to exist without srun
        pytest.skip("no srun: run slurm/dev-cluster/up.sh")
    ex = SlurmExecutor(prof, tmp_path, python="python3")
    scripts = {p: ex.submission_script("ggpo.k.a1", "ggpo:k:1", tmp_path / p, **prof.priority_parameters(p))
               for p in ("high", "normal", "low")}
    lines = {p: {line for line in text.splitlines() if line.startswith(("#SBATCH --qos", "#SBATCH --nice"))}
             for p, text in scripts.items()}
    assert lines == {"high": {"#SBATCH --qos=urgent"}, "normal": {"#SBATCH --qos=normal"},
                     "low": {"#SBATCH --qos=normal", "#SBATCH --nice=10000"}}
