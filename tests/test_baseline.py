"""`[experiment] baseline`: one home (contracts/runspec.baseline_arm) for the report, the dashboard,
`plan` and `advise`; a spec without the key keeps its hash."""
from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.contracts.runspec import baseline_arm
from ggpo_batch.errors import SpecError
from ggpo_batch.spec.parse import load_spec
from tests.support.paths import REPO

SPEC = """
schema = 1
[experiment]
name = "b"
method = "ggpo"
seeds = [1, 2]
loop_budget_seconds = 5
executor = "debug"
{baseline}
[arms.{first}]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 3
templates = ["train_direct", "train_role"]
"""

# The hashes of the shipped specs, taken before `[experiment] baseline` existed: a spec without the
# new key keeps its hash (and so its version and its runs' config hashes).
PINNED = {
    "exposure-5arm.toml": "20d23be7d23ed6b31b9aa68fd55d996c49ee16b5a327d9e73509f05ff30038b9",
    "demo-cpu.toml": "ff93141e17c81fe07ce94271d88de2980bb83699c526b49c780db80fcb9bd235",
}


def _spec(tmp_path: Path, first: str = "clean", baseline: str = "") -> Path:
    p = tmp_path / "s.toml"
    p.write_text(SPEC.format(first=first, baseline=baseline))
    return p


def test_the_default_is_clean_else_the_first_arm() -> None:
    assert baseline_arm(["paired", "clean"]) == "clean"
    assert baseline_arm(["lr_low", "lr_high"]) == "lr_low"
    assert baseline_arm(["lr_low", "clean"], "lr_low") == "lr_low"
    assert baseline_arm([]) is None


@pytest.mark.parametrize("name", sorted(PINNED))
def test_specs_without_the_key_keep_their_hash(name: str) -> None:
    assert load_spec(REPO / "jobs" / name).spec_hash == PINNED[name]


def test_a_declared_baseline_is_in_the_hash_only_where_it_changes_the_pairing(tmp_path: Path) -> None:
    plain = load_spec(_spec(tmp_path))
    same = load_spec(_spec(tmp_path, baseline='baseline = "clean"'))
    other = load_spec(_spec(tmp_path, baseline='baseline = "paired"'))
    assert plain.baseline_arm == same.baseline_arm == "clean" and other.baseline_arm == "paired"
    assert plain.spec_hash == same.spec_hash != other.spec_hash
    assert "baseline" not in plain.canonical() and other.canonical()["baseline"] == "paired"
    assert load_spec(_spec(tmp_path, first="lr_low")).baseline_arm == "lr_low"


def test_a_baseline_that_is_no_arm_is_refused_naming_the_arms(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        load_spec(_spec(tmp_path, baseline='baseline = "nope"'))
    assert e.value.field == "experiment.baseline" and "arms: clean, paired" in str(e.value)
    with pytest.raises(SpecError, match="experiment.baseline"):
        load_spec(_spec(tmp_path, baseline='baseline = "a-b"'))


def _experiment(ledger, name: str, spec: dict) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.ledger import NewRun

    runs = [NewRun(run_key=f"{name}-v1-{s}-{a}", arm=a, seed=s, config_hash="h",
                   run_spec={"executor": "local", "gpus": 1, "loop_budget_seconds": 5, "train": {}},
                   estimated_gpu_hours=0.01) for a in ("lr_high", "lr_low") for s in (1, 2)]
    ledger.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=name, spec=spec,
                             gpus=1, actor="t", runs=runs)


def test_report_and_dashboard_pair_against_the_spec_baseline(ledger, settings) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.dashboard.views import experiment_curves_view
    from ggpo_batch.reporting.report import experiment_report

    # the spec's arms in their order: lr_high first, lr_low declared
    _experiment(ledger, "declared", {"baseline": "lr_low", "arms": [{"name": "lr_high"}, {"name": "lr_low"}]})
    _experiment(ledger, "undeclared", {"arms": [{"name": "lr_high"}, {"name": "lr_low"}]})
    assert experiment_report(ledger, "declared")["baseline"] == "lr_low"
    assert experiment_report(ledger, "undeclared")["baseline"] == "lr_high"  # no clean: the spec's first arm
    assert experiment_report(ledger, "declared", baseline="lr_high")["baseline"] == "lr_high"  # --baseline wins
    assert experiment_curves_view(ledger, settings, "declared")["baseline"] == "lr_low"
    assert experiment_curves_view(ledger, settings, "undeclared", baseline="lr_low")["baseline"] == "lr_low"
