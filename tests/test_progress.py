"""Progress of long CLI work (ggpo_batch/control/progress.py): plain lines off a terminal, a rich bar on
one, silence when no command asked for it, and a real inline enqueue showing each run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggpo_batch.contracts.heartbeat import Heartbeat, write_heartbeat
from ggpo_batch.control import progress
from tests.support.paths import REPO


def test_silent_unless_a_command_turns_the_display_on(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.task("runs", total=2) as shown:
        shown.note("a")
        shown.advance()
        assert progress.current() is None
    assert capsys.readouterr() == ("", "")


def test_plain_lines_count_units_and_show_notes() -> None:
    out = io.StringIO()
    with progress.shown(out, live=False):
        with progress.task("runs", total=2) as shown:
            assert progress.current() is shown
            shown.note("exp-v1-1-clean attempt 1")
            shown.note("exp-v1-1-clean succeeded", show=False)
            shown.advance()
            shown.advance(note="exp-v1-1-paired failed")
    assert out.getvalue().splitlines() == [
        "runs 0/2: started",
        "runs 0/2: exp-v1-1-clean attempt 1",
        "runs 1/2: exp-v1-1-clean succeeded",
        "runs 2/2: exp-v1-1-paired failed",
    ]


def test_a_deferred_task_prints_nothing_when_quick_and_its_state_once_slow() -> None:
    out = io.StringIO()
    with progress.shown(out, live=False):
        with progress.task("import quick.json", total=3, after=0.3) as shown:
            shown.advance(note="reading")
        assert out.getvalue() == ""  # a refused or small file: only the command's own answer
        with progress.task("import big.json", total=3, after=0.3) as shown:
            shown.advance(note="checking 90000 record(s)")
            deadline = time.monotonic() + 10
            while not out.getvalue() and time.monotonic() < deadline:
                time.sleep(0.05)
            shown.advance(note="writing")
    assert out.getvalue().splitlines() == ["import big.json 1/3: checking 90000 record(s)",
                                           "import big.json 2/3: writing"]


def test_plain_ticker_reports_a_watched_attempt_that_has_no_heartbeat_yet(tmp_path: Path) -> None:
    out = io.StringIO()
    display = progress._Plain(out, interval=0.05)
    try:
        task = progress.Task(display, "runs", 1)
        display.open(task, 0)
        task.note("exp-v1-1-clean attempt 1")
        task.watch(tmp_path)  # an attempt folder with nothing in it yet
        deadline = time.monotonic() + 10
        while "no heartbeat yet" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        display.close()
    assert "runs 0/1: exp-v1-1-clean attempt 1 (no heartbeat yet" in out.getvalue()


def test_plain_ticker_shows_the_watched_heartbeat(tmp_path: Path) -> None:
    write_heartbeat(tmp_path, Heartbeat(step=41, loop_seconds=1830.4, budget_seconds=2700, mean_reward=0.5,
                                        tokens_per_second=900.0, updated_at=time.time()))
    out = io.StringIO()
    display = progress._Plain(out, interval=0.05)
    try:
        task = progress.Task(display, "runs", 3)
        display.open(task, 0)
        task.note("exp-v1-2-paired attempt 1")
        task.watch(tmp_path)
        deadline = time.monotonic() + 10
        while "step 41" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        display.close()
    assert "runs 0/3: exp-v1-2-paired attempt 1 step 41  1830/2700 s" in out.getvalue().splitlines()


def test_live_bar_draws_the_task_with_its_count() -> None:
    out = io.StringIO()
    with progress.shown(out, live=True):
        with progress.task("import results.json", total=3) as shown:
            for phase in ("reading", "checking", "writing"):
                shown.advance(note=phase)
    text = out.getvalue()
    assert "import results.json" in text and "3/3" in text and "writing" in text


@pytest.mark.slow
def test_inline_enqueue_shows_each_run_as_it_ends(tmp_path: Path) -> None:
    """The embedded quick start (memory:// queue, local executor) runs every job inside `enqueue`:
    stderr (not a terminal here) says which run is on and how each ended; stdout keeps its summary."""
    spec = tmp_path / "progress.toml"
    spec.write_text((REPO / "jobs" / "demo-cpu.toml").read_text()
                    .replace('name = "demo-cpu"', 'name = "progress-demo"')
                    .replace("seeds = [1, 2]", "seeds = [1]")
                    .replace("loop_budget_seconds = 6", "loop_budget_seconds = 1"))
    env = {**os.environ, "GGPO_REDIS_URL": "memory://", "GGPO_DATA_DIR": str(tmp_path / "data")}
    env.pop("GGPO_LEDGER_URL", None)
    cli = [sys.executable, "-m", "ggpo_batch.cli"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    proc = subprocess.run([*cli, "enqueue", str(spec), "--arms", "clean,paired"], env=env, capture_output=True,
                          text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    assert lines[0] == "runs 0/2: started", lines
    assert "runs 0/2: progress-demo-v1-1-clean attempt 1" in lines
    assert "runs 1/2: progress-demo-v1-1-clean succeeded" in lines
    assert "runs 2/2: progress-demo-v1-1-paired succeeded" in lines
    assert "2 run(s) queued" in proc.stdout
    assert not [line for line in proc.stdout.splitlines() if line.startswith("runs ")]
