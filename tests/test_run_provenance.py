"""Provenance of an attempt, part by part: the hardware probe through a fake `nvidia-smi` (a real
program on PATH) and a fake cpuinfo file; the code of a throwaway git checkout of the package
(commit, uncommitted changes); the file a job writes, read as untrusted; and the comparability
warnings over documents that differ in one planted field each (tests/test_provenance_runs.py plants
them in real runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ggpo_batch.contracts.hardware import cpu_model, probe_hardware, smi_accelerators
from ggpo_batch.contracts.provenance import clean, code_label, read_provenance, split_distributions, write_provenance
from ggpo_batch.reporting.provenance_checks import provenance_notes, provenance_warnings
from tests.support.paths import REPO
from tests.support.provenance import fake_nvidia_smi, head, package_checkout


def test_the_probe_reads_accelerators_from_nvidia_smi_and_the_cpu_from_cpuinfo(tmp_path: Path) -> None:
    smi = fake_nvidia_smi(tmp_path / "bin", "NVIDIA H200", count=4, memory_mib=143771, driver="570.86.15")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                       "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    hw = probe_hardware(False, None, smi=str(smi), cpuinfo=cpuinfo)
    assert hw["accelerator"] == "NVIDIA H200" and hw["accelerators"] == 4 and hw["driver"] == "570.86.15"
    assert hw["accelerator_memory_gib"] == pytest.approx(143771 / 1024, abs=0.01)
    assert hw["cpu"] == "Intel(R) Xeon(R) Platinum 8480+"
    # The GPUs the job may use are the ones asked about: the program gets their ids.
    probe_hardware(False, "0,2", smi=str(smi), cpuinfo=cpuinfo)
    assert "--id=0,2" in (tmp_path / "bin" / "nvidia-smi.args").read_text().split()
    assert len(smi_accelerators(str(smi), "0,2") or []) == 2
    # Found on PATH, as the job finds it.
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{smi.parent}{os.pathsep}{old}"
    try:
        assert probe_hardware(False, None, cpuinfo=cpuinfo)["accelerator"] == "NVIDIA H200"
    finally:
        os.environ["PATH"] = old
    # A failing program, or none: no accelerators (on a CPU node), never an error.
    broken = fake_nvidia_smi(tmp_path / "broken", "X", exit_code=9)
    assert smi_accelerators(str(broken)) is None
    assert probe_hardware(False, None, smi=str(broken), cpuinfo=cpuinfo)["accelerators"] == 0
    assert probe_hardware(False, None, smi=str(tmp_path / "absent"), cpuinfo=cpuinfo)["accelerator"] is None
    # ARM cpuinfo names the model under "Model"; an unreadable file falls back to the platform.
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n\nModel\t\t: NVIDIA Grace\n")
    assert cpu_model(arm) == "NVIDIA Grace"
    assert cpu_model(tmp_path / "nothing") == (__import__("platform").processor() or None)


def _code_of(checkout: Path) -> dict[str, Any]:
    """code_provenance() as a process running the package from `checkout` computes it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    code = "import json; from ggpo_batch.contracts.provenance import code_provenance as c; print(json.dumps(c()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=checkout,
                         env={**env, "PYTHONPATH": str(checkout)}, capture_output=True, text=True, check=True,
                         timeout=120)
    return json.loads(out.stdout)


def test_the_code_of_a_checkout_is_its_commit_and_the_hash_of_its_uncommitted_changes(tmp_path: Path) -> None:
    checkout = package_checkout(tmp_path / "checkout")
    at = head(checkout)
    clean_code = _code_of(checkout)
    assert clean_code["source"] == "checkout" and clean_code["commit"] == at
    assert clean_code["uncommitted_sha256"] is None  # __pycache__ written by the run itself does not count
    module = checkout / "ggpo_batch" / "contracts" / "outcome.py"
    module.write_text(module.read_text() + "\n# a change not committed\n")
    changed = _code_of(checkout)
    assert changed["commit"] == at and changed["uncommitted_sha256"] is not None
    assert _code_of(checkout) == changed  # the same change, the same hash
    (checkout / "ggpo_batch" / "scratch.py").write_text("x = 1\n")
    with_untracked = _code_of(checkout)
    assert with_untracked["uncommitted_sha256"] not in (None, changed["uncommitted_sha256"])
    assert code_label(with_untracked).startswith(f"checkout {at[:12]} + uncommitted ")


def test_the_file_a_job_writes_is_read_as_untrusted(tmp_path: Path) -> None:
    doc = {"version": 1, "code": {"source": "checkout", "commit": "a" * 40, "extra": "dropped"},
           "environment": {"python": "3.11.7", "distributions": ["torch==2.13.0", 5], "image_digest": "x" * 1000},
           "hardware": {"accelerator": float("nan"), "accelerators": 4, "nodes": ["n1", "n2"]},
           "spec": {"sha256": "s"}, "secret": "not kept"}
    folder = tmp_path / "attempt-1"
    write_provenance(folder, doc)
    got = read_provenance(folder)
    assert got is not None and "secret" not in got and "extra" not in got["code"]
    assert got["environment"]["distributions"] == ["torch==2.13.0"] and len(got["environment"]["image_digest"]) == 300
    assert got["hardware"]["accelerator"] is None and got["hardware"]["nodes"] == ["n1", "n2"]
    ledger_doc, listed = split_distributions(got)
    assert listed == ["torch==2.13.0"] and "distributions" not in ledger_doc["environment"]
    # Not a provenance: nothing, and no error.
    (folder / "provenance.json").write_text("[1, 2]")
    assert read_provenance(folder) is None
    (folder / "provenance.json").write_text("{" * 100000)
    assert read_provenance(folder) is None
    (folder / "provenance.json").write_bytes(b" " * (2 << 20))
    assert read_provenance(folder) is None
    assert clean({"nothing": "known"}) is None


def _doc(**changes: Any) -> dict[str, Any]:
    doc = {"code": {"source": "checkout", "commit": "1" * 40, "uncommitted_sha256": None, "version": "0.1.0",
                    "installed_sha256": None, "wheel_sha256": None},
           "environment": {"python": "3.11.7", "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27.3",
                           "deepspeed": "0.19.8", "vllm": "0.32.0", "transformers": "5.19.0", "image_digest": None,
                           "distributions_sha256": "d" * 64},
           "hardware": {"accelerator": "NVIDIA H200", "accelerators": 4, "accelerator_memory_gib": 140.4,
                        "driver": "570.86.15", "cpu": "Xeon 8480+", "cpus": 224, "nodes": ["gpu01"]},
           "spec": {"sha256": "s", "config_hash": "c"}}
    for path, value in changes.items():
        section, field = path.split("__")
        doc[section] = {**doc[section], field: value}
    return doc


def _rows(docs: dict[tuple[str, int], dict[str, Any] | None]) -> dict[str, list[dict[str, Any]]]:
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for i, ((arm, seed), doc) in enumerate(sorted(docs.items())):
        by_arm.setdefault(arm, []).append({"seed": seed, "steps": 10, "provenance": doc, "provenance_attempt": i})
    return by_arm


def test_the_warnings_name_what_differs_and_stay_silent_when_only_nodes_and_times_do() -> None:
    fair = _rows({("clean", 1): _doc(), ("clean", 2): _doc(hardware__nodes=["gpu07"]),
                  ("paired", 1): _doc(hardware__cpus=112), ("paired", 2): _doc()})
    assert provenance_warnings(fair) == [] and provenance_notes(fair) == []

    unfair = _rows({("clean", 1): _doc(), ("clean", 2): _doc(), ("paired", 1): _doc(),
                    ("paired", 2): _doc(code__commit="2" * 40, hardware__accelerator="NVIDIA A100-SXM4-80GB",
                                        environment__distributions_sha256="e" * 64)})
    lists = {3: ["numpy==2.1.3", "torch==2.13.0"], 0: ["numpy==2.1.0", "torch==2.13.0"]}
    warnings = {w["kind"]: w for w in provenance_warnings(unfair, lambda ids: {i: lists[i] for i in ids if i in lists})}
    assert set(warnings) == {"code_differs", "environment_differs", "hardware_differs"}
    assert all(w["arms"] == ["paired"] for w in warnings.values())
    code = warnings["code_differs"]["message"]
    assert "commit: 111111111111 (clean seeds 1, 2; paired seed 1) vs 222222222222 (paired seed 2)" in code
    hw = warnings["hardware_differs"]["message"]
    assert "accelerator: NVIDIA H200 (clean seeds 1, 2; paired seed 1) vs NVIDIA A100-SXM4-80GB (paired seed 2)" in hw
    assert "driver" not in hw
    env = warnings["environment_differs"]["message"]
    assert "installed distributions: dddddddddddd" in env and "(numpy 2.1.0 / 2.1.3)" in env
    # A run without provenance is not compared, and said so.
    partial = _rows({("clean", 1): _doc(), ("clean", 2): None})
    assert provenance_warnings(partial) == []
    assert provenance_notes(partial) and "1 of 2 comparable runs have no provenance" in provenance_notes(partial)[0]


def test_a_fifo_in_place_of_the_provenance_file_does_not_block_settlement(tmp_path: Path) -> None:
    """open() of a FIFO blocks until a writer comes: the reader must not wait for one."""
    os.mkfifo(tmp_path / "provenance.json")
    code = ("import sys; from pathlib import Path; from ggpo_batch.contracts.provenance import read_provenance; "
            "print(read_provenance(Path(sys.argv[1])))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                         cwd=REPO, check=False)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr


@pytest.fixture(autouse=True)
def _no_git_config_from_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    shutil.which("git") or pytest.skip("git is not installed")


def test_arms_or_seeds_that_ran_different_reward_code_are_warned() -> None:
    """[train.task] reward files: their sha256 is in the code section (contracts/provenance.reward_code)."""
    from ggpo_batch.contracts.provenance import reward_code

    mine, edited = reward_code({"/j/rewards/f.py": "a" * 64}), reward_code({"/j/rewards/f.py": "b" * 64})
    assert mine["reward_files"] == ["a" * 64 + "  /j/rewards/f.py"] and reward_code({})["reward_sha256"] is None
    same = _rows({("clean", 1): _doc(code__reward_sha256=mine["reward_sha256"]),
                  ("kl0", 1): _doc(code__reward_sha256=mine["reward_sha256"])})
    assert provenance_warnings(same) == []
    differ = _rows({("clean", 1): _doc(code__reward_sha256=mine["reward_sha256"]),
                    ("clean", 2): _doc(code__reward_sha256=mine["reward_sha256"]),
                    ("kl0", 1): _doc(code__reward_sha256=edited["reward_sha256"])})
    [w] = provenance_warnings(differ)
    assert w["kind"] == "code_differs" and w["arms"] == ["kl0"] and "reward files: " in w["message"], w
    assert clean({"code": {**_doc()["code"], **mine}})["code"]["reward_files"] == mine["reward_files"]
