from __future__ import annotations

from pathlib import Path

import pytest

from ggpo_batch.errors import SpecError
from ggpo_batch.spec.parse import load_spec, spec_diff
from tests.support.paths import REPO

GOOD = """
schema = 1
[experiment]
name = "t"
method = "ggpo"
seeds = [1, 2]
loop_budget_seconds = 5
executor = "debug"
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 3
templates = ["train_direct", "train_role"]
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.toml"
    p.write_text(text)
    return p


def test_seed_experiment_spec_expands_to_5_arms_x_3_seeds() -> None:
    spec = load_spec(REPO / "jobs" / "exposure-5arm.toml")
    runs = spec.expand(version=1)
    assert len(runs) == 15
    assert {r.arm.name for r in runs} == {"clean", "paired", "random_matched", "paired_answer", "random_answer"}
    assert {r.seed for r in runs} == {20261012, 20261013, 20261014}
    assert all(r.gpus == 4 and r.loop_budget_seconds == 2700 for r in runs)
    paired = spec.arm("paired")
    assert paired.target_exposed == 300  # 150 items x 2 templates, as budget.target_exposed in the seed
    assert spec.arm("clean").target_exposed == 0
    assert len({r.run_key for r in runs}) == 15
    assert all(r.retries == 0 for r in runs)


def test_expand_filters_and_unknown_arm(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, GOOD))
    assert [r.run_key for r in spec.expand(1, arms=["paired"], seeds=[2])] == ["t-v1-2-paired"]
    with pytest.raises(SpecError, match="no arm 'nope'"):
        spec.expand(1, arms=["nope"])
    with pytest.raises(SpecError, match=r"seed\(s\) \[9\]"):
        spec.expand(1, seeds=[9])


def test_hash_is_stable_and_sees_changes(tmp_path: Path) -> None:
    a = load_spec(_write(tmp_path, GOOD))
    b = load_spec(_write(tmp_path, GOOD.replace("seeds = [1, 2]", "seeds = [1, 2, 3]")))
    assert a.spec_hash == load_spec(_write(tmp_path, GOOD)).spec_hash
    assert a.spec_hash != b.spec_hash
    assert spec_diff(a.canonical(), b.canonical()) == ["seeds: [1, 2] -> [1, 2, 3]"]


@pytest.mark.parametrize("mutation, field, problem", [
    (("seeds = [1, 2]", "seeds = [1, 1]"), "experiment.seeds", "duplicate seed"),
    (("seeds = [1, 2]", 'seeds = ["a"]'), "experiment.seeds[0]", "must be an integer"),
    (("loop_budget_seconds = 5", "loop_budget_seconds = -5"), "experiment.loop_budget_seconds", "must be > 0"),
    (("loop_budget_seconds = 5", "loop_budget_seconds = 1e300"), "experiment.loop_budget_seconds", "<= "),
    (('method = "ggpo"', 'method = "ppo"'), "experiment.method", "must be one of ggpo"),
    (('name = "t"', 'name = "t; rm -rf /"'), "experiment.name", "not a valid name"),
    (('exposure = "none"', 'exposure = "sometimes"'), "arms.clean.exposure", "must be one of"),
    (("exposed_items = 3", "exposed_items = 0"), "arms.paired", "needs exposed_items > 0"),
    (('executor = "debug"', 'executor = "debug"\ncolour = 1'), "experiment.colour", "unknown field"),
    (("[arms.clean]", "[arms.cl-ean]"), "arms.cl-ean", "arm name"),
])
def test_bad_field_names_file_and_field(tmp_path: Path, mutation: tuple[str, str], field: str, problem: str) -> None:
    path = _write(tmp_path, GOOD.replace(*mutation))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.field == field
    assert problem in err.value.problem
    assert str(err.value).startswith(f"{path}: {field}: ")


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "missing.toml")
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)
    with pytest.raises(SpecError, match="is empty"):
        load_spec(_write(tmp_path, ""))
    with pytest.raises(SpecError, match="invalid TOML"):
        load_spec(_write(tmp_path, "[experiment\nname="))
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(p)
