"""The time budget (tests/support/budget.py) fails what it should: planted suites run in a pytest of
their own, with limits small enough to cross in a second."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

PLANTED = '''
import time
import pytest

def burn(s):
    end = time.process_time() + s
    while time.process_time() < end:
        pass

def test_quick():
    pass

def test_slow_unmarked():
    burn(0.6)

@pytest.mark.slow_reason("planted: a reason makes it allowed")
def test_slow_with_reason():
    burn(0.6)
'''


def _run(tmp_path: Path, *, cpu_budget_s: float, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_planted.py").write_text(PLANTED)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nslow_test_seconds = 0.4\ncpu_budget_seconds = {cpu_budget_s}\n")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.budget", "-p", "no:cacheprovider",
                           "--strict-markers", "--cpu-budget", "-q", *args, str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_slow_test_without_reason_fails_and_with_one_passes(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=1000)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed, 2 passed" in out and "FAILED" in out and "test_slow_unmarked" in out, out
    assert "no @pytest.mark.slow_reason" in out, out
    # the slowest are listed with their reasons, and the total is within the (large) budget
    assert "planted: a reason makes it allowed" in out and "within cpu_budget_seconds" in out, out


def test_suite_over_its_cpu_budget_fails(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=0.5, args=("-k", "not unmarked"))
    out = proc.stdout + proc.stderr
    assert "2 passed" in out and proc.returncode == 1, out  # every test passed, the budget did not
    assert "OVER cpu_budget_seconds = 0.5" in out, out


def test_suite_within_its_cpu_budget_passes(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=1000, args=("-k", "not unmarked"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_budget_holds_under_xdist(tmp_path: Path) -> None:
    """Each worker measures its tests and the controller adds them up."""
    proc = _run(tmp_path, cpu_budget_s=0.5, args=("-k", "not unmarked", "-n", "2"))
    out = proc.stdout + proc.stderr
    assert "2 passed" in out and proc.returncode == 1 and "OVER cpu_budget_seconds" in out, out
