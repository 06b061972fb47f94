"""A job's logs are the job's files, not ours (ggpo_batch/common/untrusted_files.py): `logs` and the
dashboard's run page read them only as regular files inside the attempt folder, in bounded memory,
the tail from the end; a link leading out of the folder, a FIFO, a device or an unreadable file is
named in one line (exit 2; 6 for unreadable), the others still shown; odd file names are not ranks;
a file deleted while followed is still read. Each through a real process (the old code blocked on a
FIFO, read a whole file into memory, re-read it quadratically for -n, and raised on "²"), on
SQLite and on PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ggpo_batch.common.schemas import SCHEMAS
from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.joblogs import log_path
from tests.dashboard.server import Dashboard, get
from tests.support.paths import REPO
from tests.support.processes import ggpo_measured, unprivileged, unprivileged_prefix
from tests.support.waiting import wait_until

KEY = "lu-v1-1-clean"
JOB = "4242"
SECRET_TEXT = "TOP-SECRET-OUTSIDE-THE-FOLDER"
MIB = 1 << 20


@pytest.fixture
def led(env: dict[str, str], db_url: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A ledger (both backends) with one run whose attempt 1 is job 4242 of the local executor."""
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    ledger = connect(db_url)
    ledger.create_experiment(name="lu", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key=KEY, arm="clean", seed=1, config_hash="c", run_spec={})])
    ledger.begin_attempt(KEY, executor="local", gpus=4, actor="t", worker="host.1")
    ledger.mark_submitted(KEY, 1, job_id=JOB, actor="t")
    yield ledger
    ledger.engine.dispose()


def _folder(env: dict[str, str]) -> Path:
    folder = attempt_folder(Path(env["GGPO_DATA_DIR"]) / "jobs", KEY, 1)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _log(env: dict[str, str], rank: int, stream: str) -> Path:
    return log_path(_folder(env), JOB, rank, stream)


def _logs(*args: str, timeout: float = 60, privileged: bool = True):  # type: ignore[no-untyped-def]
    return ggpo_measured(["logs", KEY, *args], dict(os.environ), timeout=timeout, privileged=privileged)


def _errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr[-3000:]
    return [line for line in stderr.splitlines() if line.strip()]


def _hostile_folder(env: dict[str, str], tmp_path: Path) -> dict[str, Path]:
    """Rank 0: a good stdout, a stderr linked to a file outside; rank 1: a FIFO and (as root) a
    device; rank 2: a link to rank 0's stdout (inside: fine); files whose 'rank' is "²" or "٣"."""
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET_TEXT + "\n")
    good = _log(env, 0, "stdout")
    good.write_text("rank 0 says hello\n")
    _log(env, 0, "stderr").symlink_to(outside)
    os.mkfifo(_log(env, 1, "stdout"))
    refused = {"link out": _log(env, 0, "stderr"), "fifo": _log(env, 1, "stdout")}
    if os.geteuid() == 0:  # a device node inside the folder (as the job could make one, were it root)
        os.mknod(_log(env, 1, "stderr"), 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        refused["device"] = _log(env, 1, "stderr")
    else:
        _log(env, 1, "stderr").write_text("")
    _log(env, 2, "stdout").symlink_to(good.name)
    for odd in (f"{JOB}_\u00b2_log.out", f"{JOB}_\u0663_log.err", f"{JOB}_{'9' * 5000}_log.out"[:255]):
        (_folder(env) / odd).write_text("not a rank\n")
    return refused


def test_links_out_fifos_and_devices_are_refused_one_line_each_the_rest_shown(led, env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    refused = _hostile_folder(env, tmp_path)
    for args in ((), ("-n", "5")):
        res = _logs(*args)
        assert res.returncode == 2, (args, res.stderr)
        lines = _errors(res.stderr)
        assert len(lines) == len(refused), lines
        for line, (case, path) in zip(sorted(lines), sorted(refused.items(), key=lambda kv: str(kv[1]))):
            words = {"link out": "is a symbolic link leading outside the attempt folder",
                     "fifo": "is a FIFO, not a regular file", "device": "is a character device"}[case]
            assert line.startswith(f"error: {path}: ") and words in line, (case, line)
        assert SECRET_TEXT not in res.stdout
        assert res.stdout.count("rank 0 says hello") == 2  # rank 0's file and rank 2's link to it
    doc = json.loads(_logs("--json").stdout)
    assert doc["schema"] == SCHEMAS["logs"].number and doc["ranks"] == [0, 1, 2]
    problems = {Path(f["path"]).name: f["problem"] for f in doc["files"]}
    assert problems[f"{JOB}_0_log.out"] is None and "outside the attempt folder" in problems[f"{JOB}_0_log.err"]
    assert "FIFO" in problems[f"{JOB}_1_log.out"] and problems[f"{JOB}_2_log.err"] is None


def test_an_unreadable_log_is_named_in_one_line_plain_and_followed(led, env) -> None:  # type: ignore[no-untyped-def]
    out, err = _log(env, 0, "stdout"), _log(env, 0, "stderr")
    out.write_text("readable line\n")
    err.write_text("hidden line\n")
    err.chmod(0o000)
    res = _logs(privileged=False)
    assert res.returncode == 6, res.stderr
    assert _errors(res.stderr) == [f"error: not permitted: reading {err}, cannot be read (Permission denied)"]
    assert "readable line" in res.stdout and "hidden line" not in res.stdout
    led.mark_running(KEY, 1, actor="t")
    with _following(unprivileged([sys.executable, "-m", "ggpo_batch.cli", "logs", KEY, "-f"])) as follower:
        _wait_open(follower, out)
        with open(out, "a") as fh:
            fh.write("written while followed\n")
        time.sleep(2)  # a few of the follower's polls (0.5 s) with the new line there, then the end
        stdout, stderr = _ended(led, follower)
    assert follower.returncode == 6, stderr
    assert _errors(stderr) == [f"error: not permitted: reading {err}, cannot be read (Permission denied)"]  # once, not every poll
    assert "written while followed" in stdout and "hidden line" not in stdout


@contextlib.contextmanager
def _following(cmd: list[str]) -> Iterator[subprocess.Popen[str]]:
    """`logs -f` in a process of its own (killed if the test ends first)."""
    follower = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        yield follower
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def _wait_open(follower: subprocess.Popen[str], path: Path, timeout_s: float = 60) -> None:
    """Until the follower holds `path` open (its descriptors in /proc; setpriv execs, same pid)."""
    def holds() -> bool:
        fds = Path(f"/proc/{follower.pid}/fd")
        try:
            return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
        except OSError:  # a descriptor closed while listed
            return False
    wait_until(holds, timeout_s, f"the follower to open {path}", interval=0.05)


def _ended(led, follower: subprocess.Popen[str]) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The attempt's end booked: what the follower printed until it ended by itself."""
    led.mark_finished(KEY, 1, attempt_state="succeeded", run_state="succeeded", actor="t")
    return follower.communicate(timeout=60)


def _progress_bar(path: Path, size: int) -> bytes:
    """A log of `size` bytes written as a progress bar does: one line rewritten with "\\r", no "\\n"."""
    with open(path, "wb") as fh:
        n = 0
        while fh.tell() < size:
            fh.write(f"\rstep {n:>9} [{'#' * (n % 50):<50}] loss 0.{n % 997:03d}".encode())
            n += 1
    with open(path, "rb") as fh:
        fh.seek(-4096, os.SEEK_END)
        return fh.read()


@pytest.mark.slow
def test_a_huge_log_streams_in_bounded_memory_and_its_tail_is_read_from_the_end(led, env) -> None:  # type: ignore[no-untyped-def]
    err = _log(env, 0, "stderr")
    tail = _progress_bar(err, 64 * MIB)
    res = _logs("--rank", "0", "--stream", "stderr", "-n", "5", timeout=60)
    assert res.returncode == 0, res.stderr
    # the last 5 "lines", as a terminal counts them, each on a line of its own: a "\r" passed through
    # would let a redraw hide text before it
    assert res.stdout == "\n".join(tail.decode().split("\r")[-5:]) + "\n"
    assert res.max_rss_bytes < 200 * MIB and res.seconds < 30, (res.max_rss_bytes, res.seconds)
    out = _log(env, 0, "stdout")
    with open(out, "wb") as fh:  # 64 MiB without any line end
        fh.writelines(b"x" * MIB for _ in range(64))
    res = _logs("--rank", "0", "--stream", "stdout", timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout) == 64 * MIB + 1 and set(res.stdout[:-1]) == {"x"}
    assert res.max_rss_bytes < 200 * MIB, res.max_rss_bytes  # the old code held the file 3 times over


def test_a_log_deleted_while_followed_is_read_to_its_end(led, env) -> None:  # type: ignore[no-untyped-def]
    led.mark_running(KEY, 1, actor="t")
    err = _log(env, 0, "stderr")
    err.write_text("")
    cmd = [sys.executable, "-m", "ggpo_batch.cli", "logs", KEY, "-f", "--rank", "0", "--stream", "stderr"]
    with _following(cmd) as follower:
        with open(err, "a") as fh:  # the job's own descriptor: it writes on after the file is deleted
            fh.write("before the delete\n")
            fh.flush()
            _wait_open(follower, err)  # polled: on a busy machine the follower starts seconds later
            err.unlink()
            fh.write("after the delete\n")
            fh.flush()
            time.sleep(1)  # a poll or two while the file is gone (the end's flush reads the rest anyway)
        stdout, stderr = _ended(led, follower)
    assert follower.returncode == 0 and not _errors(stderr), stderr
    assert stdout.splitlines() == ["before the delete", "after the delete"]


@pytest.mark.slow
def test_the_run_page_and_its_api_apply_the_same_rules_within_their_time(led, env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    refused = _hostile_folder(env, tmp_path)
    with open(_log(env, 2, "stderr"), "wb") as fh:  # 32 MiB, no line end: 200 "lines" are all of it
        fh.writelines(b"y" * MIB for _ in range(32))
    unreadable = _log(env, 3, "stdout")
    unreadable.write_text("UNREADABLE-CONTENT\n")
    unreadable.chmod(0o000)
    dash = Dashboard(dict(os.environ), tmp_path / "dashboard.log", prefix=unprivileged_prefix())
    try:
        t0 = time.monotonic()
        code, body = get(f"{dash.url}/api/runs/{KEY}")
        assert code == 200 and time.monotonic() - t0 < 20, (code, body[:500])
        doc = json.loads(body)
        assert doc["schema"] == SCHEMAS["dashboard_run"].number
        logs = {entry["name"]: entry for entry in doc["attempts"][0]["logs"]}
        for path in refused.values():
            assert logs[path.name]["problem"] and logs[path.name]["tail"] == "", logs[path.name]
        assert logs[unreadable.name]["problem"] == "cannot be read (Permission denied)"
        big = logs[f"{JOB}_2_log.err"]
        assert big["problem"] is None and big["size"] == 32 * MIB
        assert len(big["tail"].encode()) < 300 << 10 and big["tail"].startswith("[... earlier output not shown")
        assert logs[f"{JOB}_0_log.out"]["tail"] == "rank 0 says hello\n"
        code, page = get(f"{dash.url}/runs/{KEY}")
        assert code == 200 and SECRET_TEXT not in page and "UNREADABLE-CONTENT" not in page
        assert "is a FIFO, not a regular file" in page and "cannot be read (Permission denied)" in page
    finally:
        dash.stop()


# -- the pieces, without a ledger ---------------------------------------------------------------------


def _reference_start(data: bytes, lines: int) -> int:
    if lines <= 0:
        return len(data)
    ends = [m.end() for m in re.finditer(rb"\r\n|\n|\r", data) if m.end() != len(data)]
    return ends[-lines] if len(ends) >= lines else 0


def test_line_start_finds_the_last_lines_whatever_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Against a regular expression over the whole file, for random files of "\\n", "\\r\\n" and lone
    "\\r" line ends read in blocks of 1 to 8 bytes (a "\\r\\n" split between two blocks is one end)."""
    from ggpo_batch.common import untrusted_files
    from ggpo_batch.common.untrusted_files import line_start

    rng = random.Random(29)
    with tempfile.TemporaryFile() as fh:
        for _ in range(2000):
            data = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 40)))
            fh.seek(0)
            fh.truncate()
            fh.write(data)
            fh.flush()
            lines = rng.randint(0, 6)
            monkeypatch.setattr(untrusted_files, "BLOCK_BYTES", rng.randint(1, 8))
            assert line_start(fh.fileno(), len(data), lines) == _reference_start(data, lines), (data, lines)


def test_line_cuts_never_split_a_word_and_hold_a_bounded_amount() -> None:
    from ggpo_batch.reporting import joblogs
    from ggpo_batch.reporting.joblogs import LineCuts

    cuts = LineCuts()
    pieces = [cuts.feed(t) for t in ("pass", "word-in-a-line\nnext pa", "rt\r", "x" * (joblogs.HOLD_MAX_CHARS + 10))]
    assert pieces[:3] == ["", "password-in-a-line\n", "next part\r"]
    assert pieces[3] == "x" * (joblogs.HOLD_MAX_CHARS + 10) and cuts.flush() == ""  # no space: written whole


def test_every_carriage_return_is_shown_as_a_line_end_across_chunks() -> None:
    """A progress bar's bare "\\r" and a "\\r\\n" split between two reads are each one line end: a "\\r"
    sent to a terminal would let the next text overwrite the line, and one line end is never two."""
    from ggpo_batch.common.printable import LineEnds, terminal_text

    as_lines = LineEnds()
    chunks = ["step 1\rstep 2\r", "\nwarn\r\n", "", "tail\r", "", "\nend"]
    shown = "".join(as_lines(c) for c in chunks)
    assert shown == "step 1\nstep 2\nwarn\ntail\nend"
    assert terminal_text(shown) == shown  # nothing left for the terminal escaping to mangle
    assert "".join(LineEnds()(c) for c in ["a\r", "b"]) == "a\nb"
