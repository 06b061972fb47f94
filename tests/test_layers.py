"""The package's floors (tools/check/layers.py): the package passes, and the check fails on a planted
upward import, a planted import between two parts of one floor, and a planted circle."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "check"))

import layers  # noqa: E402


def test_the_package_has_no_upward_import_and_no_circle() -> None:
    findings = layers.check(ROOT / "ggpo_batch")
    assert findings == [], "\n".join(f"{f.kind}: {f.text}" for f in findings)


def _copy(tmp_path: Path) -> Path:
    pkg = tmp_path / "ggpo_batch"
    shutil.copytree(ROOT / "ggpo_batch", pkg, ignore=shutil.ignore_patterns("__pycache__", "data", "static",
                                                                             "templates"))
    return pkg


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


def test_a_planted_upward_import_fails_even_under_type_checking(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    _plant(pkg / "common" / "limits.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
           "    from ..control.worker import execute_run")
    kinds = {(f.kind, f.text.split(" ")[0]) for f in layers.check(pkg)}
    assert ("upward", "ggpo_batch.common.limits") in kinds


def test_a_planted_import_inside_train_against_its_floors_fails(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    _plant(pkg / "train" / "task" / "qa.py", "def _late():\n    from ..run import trainer")
    assert any(f.kind == "upward" and f.text.startswith("ggpo_batch.train.task.qa") for f in layers.check(pkg))


def test_a_planted_same_floor_import_and_a_circle_fail(tmp_path: Path) -> None:
    pkg = _copy(tmp_path)
    _plant(pkg / "ledger" / "costs.py", "from ..train import config")
    _plant(pkg / "ledger" / "runs.py", "from .costs import CostRecords")
    _plant(pkg / "ledger" / "core.py", "from .runs import RunTransitions")
    found = layers.check(pkg)
    assert any(f.kind == "same floor" and "ggpo_batch.ledger.costs" in f.text for f in found)
    assert any(f.kind == "circle" and "ggpo_batch.ledger.core" in f.text for f in found)
