"""`ggpo-batch logs`: which attempt and files, clear exits when there is nothing (yet), tails, and
following a file as it grows until the ledger says the attempt ended. A real job's logs, followed
while it trains: tests/test_live_job.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.joblogs import DEBUG_ERROR_NAME, log_path, tail_text
from tests.support.paths import REPO

KEY = "lg-v1-1-clean"


@pytest.fixture
def led(env: dict[str, str], db_url: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    ledger = connect(db_url)
    ledger.create_experiment(name="lg", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key=KEY, arm="clean", seed=1, config_hash="c", run_spec={})])
    yield ledger
    ledger.engine.dispose()


def _logs(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["logs", *args])


def _folder(env: dict[str, str], number: int = 1) -> Path:
    return attempt_folder(Path(env["GGPO_DATA_DIR"]) / "jobs", KEY, number)


def _submitted(led, job_id: str = "4242", executor: str = "local") -> None:  # type: ignore[no-untyped-def]
    led.begin_attempt(KEY, executor=executor, gpus=4, actor="t", worker="host.123")
    led.mark_submitted(KEY, 1, job_id=job_id, actor="t")


def _write_logs(folder: Path, job_id: str, ranks: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        log_path(folder, job_id, r, "stdout").write_text(f"rank {r} says hello\n")
        log_path(folder, job_id, r, "stderr").write_text(f"rank{r} step 1 loss 0.5\nrank{r} step 2 loss 0.4\n")


def test_an_unknown_run_or_attempt_is_bad_input(led) -> None:  # type: ignore[no-untyped-def]
    res = _logs("lg-v1-9-nope")
    assert res.exit_code == 2 and "no run 'lg-v1-9-nope'" in res.output
    _submitted(led)
    res = _logs(KEY, "--attempt", "3")
    assert res.exit_code == 2 and "no attempt 3" in res.output


def test_no_log_yet_exits_5_saying_why(led, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    res = _logs(KEY)
    assert res.exit_code == 5 and "is queued and has no attempt yet" in res.output
    led.begin_attempt(KEY, executor="local", gpus=4, actor="t", worker="w")
    res = _logs(KEY)
    assert res.exit_code == 5 and "is submitting: no job yet" in res.output
    led.mark_submitted(KEY, 1, job_id="4242", actor="t")
    res = _logs(KEY)
    assert res.exit_code == 5 and "(job 4242) has no log yet" in res.output and "waiting for its allocation" in res.output
    _write_logs(_folder(env), "4242")  # and once the job writes, the same command shows it
    assert _logs(KEY).exit_code == 0


def test_a_debug_attempt_points_at_its_worker_and_shows_its_error(led, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    _submitted(led, "debug-1-1", executor="debug")
    res = _logs(KEY)
    assert res.exit_code == 5 and "inside its worker's process" in res.output and "host.123" in res.output
    _folder(env).mkdir(parents=True)
    (_folder(env) / DEBUG_ERROR_NAME).write_text("GgpoError: out of budget\n")
    res = _logs(KEY)
    assert res.exit_code == 0 and "GgpoError: out of budget" in res.output


def test_every_rank_stdout_then_stderr_or_one_rank_or_a_tail(led, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    _submitted(led)
    _write_logs(_folder(env), "4242")
    out = _logs(KEY).output
    headers = [line for line in out.splitlines() if line.startswith("==> ")]
    assert headers == [f"==> {_folder(env) / name} <==" for name in
                       ("4242_0_log.out", "4242_0_log.err", "4242_1_log.out", "4242_1_log.err")]
    assert "rank 0 says hello" in out and "rank1 step 2 loss 0.4" in out
    out = _logs(KEY, "--rank", "1", "--stream", "stderr", "-n", "1").output
    assert out == "rank1 step 2 loss 0.4\n"
    res = _logs(KEY, "--rank", "5")
    assert res.exit_code == 2 and "ranks with a log: 0, 1" in res.output
    import json

    data = json.loads(_logs(KEY, "--json").output)
    assert data["job_id"] == "4242" and data["ranks"] == [0, 1] and len(data["files"]) == 4
    assert data["files"][0]["bytes"] == len("rank 0 says hello\n")


def test_a_requeued_job_is_read_from_the_folder_of_the_attempt_that_submitted_it(led, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    _submitted(led)
    led.mark_running(KEY, 1, actor="t")
    led.book_requeue(KEY, 1, actor="t", started_at=None, ended_at=None, elapsed_seconds=1.0, gpu_hours_scheduler=0.1,
                     next_started_at=None)
    _write_logs(_folder(env, 1), "4242", ranks=1)
    res = _logs(KEY, "--attempt", "2", "--stream", "stdout")
    assert res.exit_code == 0 and res.output == "rank 0 says hello\n"


def test_tail_reads_the_last_lines_of_a_large_file(tmp_path: Path) -> None:
    p = tmp_path / "big.log"
    p.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert tail_text(p, 3) == "line 199997\nline 199998\nline 199999\n"
    assert tail_text(p, 0) == "" and tail_text(tmp_path / "absent", 5) == ""
    p.write_bytes(b"ok \xff\xfe\n")
    assert tail_text(p) == "ok \ufffd\ufffd\n"


def test_follow_prints_what_the_job_writes_until_its_attempt_ends(led, env: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """The attempt runs with no log yet: `logs -f` (a real process) says it waits; then the job writes
    and each line is printed; the follower returns by itself once the ledger books the attempt's end."""
    _submitted(led)
    led.mark_running(KEY, 1, actor="t")
    folder = _folder(env)
    err = log_path(folder, "4242", 0, "stderr")
    follower = subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "logs", KEY, "-f", "--rank", "0",
                                 "--stream", "stderr"],
                                cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, encoding="utf-8")
    try:
        said = follower.stderr.readline()  # type: ignore[union-attr]  # blocks until it speaks (or exits)
        assert "has no log yet" in said and "waiting for it" in said, said
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(5):
            with open(err, "a") as fh:
                fh.write(f"step {i} \u00e9t\u00e9\n")  # multi-byte characters, split across reads or not
            time.sleep(0.4)
        led.mark_finished(KEY, 1, attempt_state="succeeded", run_state="succeeded", actor="t")
        ended = time.monotonic()
        out, rest = follower.communicate(timeout=60)
        # it ended by itself, soon after the attempt did (it checks the ledger every 2 s; a loaded machine)
        assert time.monotonic() - ended < 30
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, rest
    assert out.splitlines() == [f"step {i} \u00e9t\u00e9" for i in range(5)]
