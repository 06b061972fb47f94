"""`nodes` in spec and profile without a cluster: validation (file + field, exit 2), the run spec and
the spec hash of 1-node specs unchanged, and the estimate of `enqueue --dry-run`: a 2-node spec
costs twice the same spec on 1 node (nodes x GPUs per node x seconds / 3600)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.accounting import allocated_gpus, gpu_hours
from ggpo_batch.contracts.runspec import RunSpec
from ggpo_batch.errors import SpecError
from ggpo_batch.executor.profile import load_profile, profile_from_mapping
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import JOBS, PROFILES

TWO_NODE = JOBS / "two-node-cpu.toml"


@pytest.fixture
def db_url(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"  # the estimate is backend-neutral (no history here)


def _one_node_twin(tmp_path: Path) -> Path:
    """jobs/two-node-cpu.toml on ONE node of the same shape (2 GPUs, profile dev-cluster-2gpu)."""
    text = TWO_NODE.read_text()
    assert "nodes = 2" in text and 'profile = "dev-cluster-2node"' in text
    p = tmp_path / "one-node-cpu.toml"
    p.write_text(text.replace("nodes = 2", "nodes = 1").replace('profile = "dev-cluster-2node"',
                                                                'profile = "dev-cluster-2gpu"'))
    return p


def _dry_run(path: Path) -> dict:
    res = CliRunner().invoke(cli, ["enqueue", str(path), "--dry-run", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_dry_run_of_a_two_node_spec_estimates_twice_the_same_spec_on_one_node(env, ledger, tmp_path):  # type: ignore[no-untyped-def]
    two, one = _dry_run(TWO_NODE), _dry_run(_one_node_twin(tmp_path))
    assert two["dry_run"] and one["dry_run"] and len(two["runs"]) == len(one["runs"]) == 2
    assert two["estimated_gpu_hours"] == pytest.approx(2 * one["estimated_gpu_hours"])
    spec = load_spec(TWO_NODE)
    seconds = spec.loop_budget_seconds + spec.overheads.total_seconds
    for run in two["runs"]:  # nodes x GPUs per node x (loop + overheads) / 3600
        assert run["estimated_gpu_hours"] == pytest.approx(2 * 2 * seconds / 3600)
    assert "2 nodes x 2 GPUs" in two["cost_basis"] and "nodes" not in one["cost_basis"]


def test_dry_run_text_names_nodes_x_gpus(env, ledger):  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(cli, ["enqueue", str(TWO_NODE), "--dry-run"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "(2 nodes x 2 GPUs x (" in res.output and "dry run: nothing written" in res.output


@pytest.mark.parametrize("value, problem", [("0", "between 1 and 64"), ('"2"', "integer"), ("65", "between 1 and 64"), ("true", "integer")])
def test_bad_nodes_is_refused_naming_file_and_field(tmp_path, value, problem):  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.toml"
    p.write_text(TWO_NODE.read_text().replace("nodes = 2 ", f"nodes = {value} "))
    with pytest.raises(SpecError) as exc:
        load_spec(p)
    assert "experiment.nodes" in exc.value.message and str(p) in exc.value.message
    assert problem in exc.value.message, exc.value.message


def test_more_than_one_node_needs_the_slurm_executor(tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "local.toml"
    p.write_text(TWO_NODE.read_text().replace('executor = "slurm"', 'executor = "local"'))
    with pytest.raises(SpecError, match=r"experiment\.nodes.*slurm"):
        load_spec(p)


def test_cli_exit_2_when_spec_nodes_and_profile_nodes_differ(env, ledger, tmp_path):  # type: ignore[no-untyped-def]
    p = tmp_path / "mismatch.toml"
    p.write_text(TWO_NODE.read_text().replace('profile = "dev-cluster-2node"', 'profile = "dev-cluster-2gpu"'))
    res = CliRunner().invoke(cli, ["enqueue", str(p), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert "experiment.nodes" in res.output and "dev-cluster-2gpu" in res.output


def test_run_spec_carries_nodes_and_one_node_specs_keep_their_json_and_hash(tmp_path):  # type: ignore[no-untyped-def]
    two = load_spec(TWO_NODE)
    [run, *_] = two.expand(1)
    assert run.nodes == 2 and run.gpus == 2 and run.allocated_gpus == allocated_gpus(2, 2) == 4
    assert RunSpec.from_json(run.to_json()) == run and json.loads(run.to_json())["nodes"] == 2
    one = load_spec(_one_node_twin(tmp_path))
    [run1, *_] = one.expand(1)
    # at the default, nothing about nodes is written: queued run specs and spec hashes from before stay
    assert "nodes" not in json.loads(run1.to_json()) and "nodes" not in one.canonical()
    assert RunSpec.from_json(run1.to_json()).nodes == 1
    assert one.spec_hash != two.spec_hash and run1.config_hash != run.config_hash


def test_profile_nodes_and_pace_are_validated():
    path = Path("p.toml")
    with pytest.raises(SpecError, match="nodes"):
        profile_from_mapping({"nodes": 0}, path, "p")
    with pytest.raises(SpecError, match="submit_rate_per_s"):
        profile_from_mapping({"submit_rate_per_s": -1}, path, "p")
    with pytest.raises(SpecError, match="submit_rate_per_s"):
        profile_from_mapping({"submit_rate_per_s": float("nan")}, path, "p")
    with pytest.raises(SpecError, match="extra_sbatch"):
        profile_from_mapping({"extra_sbatch": ["--nodes=3"]}, path, "p")  # nodes belongs to the profile's key
    p = load_profile("dev-cluster-2node", PROFILES)
    assert p.nodes == 2 and p.to_submitit_parameters()["nodes"] == 2 and p.to_auto_parameters()["nodes"] == 2
    assert (p.pace.burst, p.pace.rate_per_s) == (30, 2.0)  # Slurm's own per-user default


def test_gpu_hours_formula_is_nodes_x_gpus_per_node_x_seconds():
    assert gpu_hours(allocated_gpus(2, 4), 3600) == 8.0
    assert gpu_hours(allocated_gpus(1, 4), 1800) == 2.0


@pytest.mark.redis
def test_status_shows_nodes_x_gpus(ledger, settings):  # type: ignore[no-untyped-def]
    import io

    from rich.console import Console

    from ggpo_batch.cli.tables import print_status
    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.reporting.status import iter_experiment_status

    enqueue_spec(ledger, settings, load_spec(TWO_NODE), actor="tester")
    [(summary, rows)] = list(iter_experiment_status(ledger))
    assert (summary["nodes"], summary["gpus"]) == (2, 2)
    out = io.StringIO()
    print_status([{**summary, "runs": list(rows)}], Console(file=out, width=200))
    assert "2 nodes x 2 GPUs/run" in out.getvalue()
    assert "4 GPUs/run" not in out.getvalue()
