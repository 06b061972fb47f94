"""The time budget (tests/support/budget.py) fails what it should: planted suites run in a pytest of
their own, with limits small enough to cross in a second."""

from __future__ import annotations

import json
import os
import re
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


# A test that starts work it does not wait for, as a Slurm job's ranks are (slurmd's children): a
# process left to init by a shell that exits at once, burning 1.5 CPU-s, then writing a file the
# test polls for. Its CPU is in no test's figure, only in the machine's.
DETACHED = '''
import subprocess, sys, time
from pathlib import Path

BURN = "import time, sys; end = time.process_time() + 1.5\\nwhile time.process_time() < end: pass\\nopen(sys.argv[1], 'w').close()"

def test_detached_work(tmp_path):
    done = tmp_path / "done"
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" "$1" &', BURN, str(done)], check=True)
    deadline = time.monotonic() + 60
    while not done.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
'''


# A test that leaves a finished child unreaped (as a vLLM engine's process can be until the next
# multiprocessing start) and the next test, which reaps it: the CPU the child used before that test
# began is not the next test's (without that, test_reaps would be charged 1.5 CPU-s and fail).
REAPED_LATER = '''
import subprocess, sys, time
from pathlib import Path

BURN = "import time, sys; end = time.process_time() + 1.5\\nwhile time.process_time() < end: pass\\nopen(sys.argv[1], 'w').close()"
LEFT = []

def test_leaves_a_finished_child(tmp_path):
    LEFT.append(subprocess.Popen([sys.executable, "-c", BURN, str(tmp_path / "done")]))
    deadline = time.monotonic() + 60
    stat = Path(f"/proc/{LEFT[0].pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # finished, not reaped (poll would reap it)
        assert time.monotonic() < deadline
        time.sleep(0.05)

def test_reaps_it():
    assert LEFT[0].wait() == 0
'''


def _run(tmp_path: Path, *, cpu_budget_s: float, args: tuple[str, ...] = (), machine_budget_s: float = 0,
         planted: str = PLANTED) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_planted.py").write_text(planted)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nslow_test_seconds = 0.4\ncpu_budget_seconds = {cpu_budget_s}\n"
                                         f"machine_cpu_budget_seconds = {machine_budget_s}\n")
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
    most = out.split("the ten that used the most CPU:\n", 1)[1].splitlines()[:2]
    assert {line.rsplit("::", 1)[1] for line in most} == {"test_slow_unmarked", "test_slow_with_reason"}, out


def test_every_tests_figures_are_written_where_asked(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=1000, args=("-k", "not unmarked", "--budget-json", str(tmp_path / "b.json")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    figures = json.loads((tmp_path / "b.json").read_text())
    rows = {r["test"].rsplit("::", 1)[1]: r for r in figures["tests"]}
    assert set(rows) == {"test_quick", "test_slow_with_reason"}
    assert rows["test_slow_with_reason"]["cpu_s"] >= 0.6 > rows["test_quick"]["cpu_s"]
    assert rows["test_slow_with_reason"]["slow_reason"] == "planted: a reason makes it allowed"
    assert figures["total_cpu_s"] == pytest.approx(sum(r["cpu_s"] for r in figures["tests"]), abs=0.1)


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


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="children are read from /proc")
def test_a_child_reaped_by_a_later_test_is_not_charged_to_it(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=1000, planted=REAPED_LATER)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "2 passed" in out, out
    most = out.split("the ten that used the most CPU:\n", 1)[1].splitlines()[:2]
    charged = {line.rsplit("::", 1)[1]: float(line.split()[0]) for line in most}
    assert charged["test_reaps_it"] < 0.4 and charged["test_leaves_a_finished_child"] < 0.4, out


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine's CPU time is read from /proc/stat")
def test_work_no_test_waits_for_counts_in_the_machines_budget(tmp_path: Path) -> None:
    """The tests' figure misses a detached process's 1.5 CPU-s; the machine's does not, and fails
    the run over its limit."""
    proc = _run(tmp_path, cpu_budget_s=1.0, machine_budget_s=1.0, planted=DETACHED)
    out = proc.stdout + proc.stderr
    assert "1 passed" in out and proc.returncode == 1, out
    assert "within cpu_budget_seconds = 1" in out, out  # the test's own process and children: under 1 s
    figure = re.search(r"daemons\): (\d+) s, OVER machine_cpu_budget_seconds = 1 ", out)
    assert figure and int(figure.group(1)) >= 1, out


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine's CPU time is read from /proc/stat")
def test_the_machines_budget_passes_within_it(tmp_path: Path) -> None:
    proc = _run(tmp_path, cpu_budget_s=1.0, machine_budget_s=10_000, planted=DETACHED)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "within machine_cpu_budget_seconds = 10000" in out, out
