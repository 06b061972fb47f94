"""The heartbeat contract (file, atomic write, a read that never raises), its way into the ledger, and
the hung flag in `status` -- on SQLite and PostgreSQL. A real job's heartbeats: tests/test_live_job.py."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.config.settings import load_settings
from ggpo_batch.contracts.heartbeat import (
    HEARTBEAT_NAME,
    HUNG_AFTER_SECONDS,
    Heartbeat,
    heartbeat_path,
    is_hung,
    read_heartbeat,
    write_heartbeat,
)
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.ledger.heartbeats import attempt_heartbeat
from ggpo_batch.reporting.status import experiment_status, state_label

HB = Heartbeat(step=41, loop_seconds=1830.0, budget_seconds=2700.0, mean_reward=0.25, tokens_per_second=812.5,
               updated_at=1_796_000_000.5)


def test_write_then_read_gives_the_same_heartbeat_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    write_heartbeat(tmp_path / "attempt-1", HB)
    assert read_heartbeat(tmp_path / "attempt-1") == HB
    assert [p.name for p in (tmp_path / "attempt-1").iterdir()] == [HEARTBEAT_NAME]
    write_heartbeat(tmp_path / "attempt-1", Heartbeat(0, 0.0, 6.0, float("nan"), None, 1.0))
    assert read_heartbeat(tmp_path / "attempt-1") == Heartbeat(0, 0.0, 6.0, None, None, 1.0)  # NaN: unknown


@pytest.mark.parametrize("content", [
    b"", b'{"step": 4', b"\x00\xff garbage", b"[]", b"null", b'"text"', b"[" * 100_000,
    json.dumps({**HB.to_dict(), "step": "41"}).encode(), json.dumps({**HB.to_dict(), "step": True}).encode(),
    json.dumps({**HB.to_dict(), "step": -1}).encode(), json.dumps({**HB.to_dict(), "updated_at": None}).encode(),
    json.dumps({**HB.to_dict(), "loop_seconds": "1e999"}).encode(), b'{"step": 1, "loop_seconds": NaN}',
    json.dumps({**HB.to_dict(), "tokens_per_second": -3.0}).encode(),
    json.dumps({k: v for k, v in HB.to_dict().items() if k != "budget_seconds"}).encode(),
    b" " * (70 * 1024) + json.dumps(HB.to_dict()).encode(),  # bigger than any heartbeat: not read
])
def test_a_half_written_or_foreign_file_reads_as_none(tmp_path: Path, content: bytes) -> None:
    heartbeat_path(tmp_path).write_bytes(content)
    assert read_heartbeat(tmp_path) is None


def test_missing_unreadable_or_not_a_file_reads_as_none(tmp_path: Path) -> None:
    assert read_heartbeat(tmp_path / "nowhere") is None
    heartbeat_path(tmp_path).mkdir()
    assert read_heartbeat(tmp_path) is None
    # and the reader is not fooled into a pass: the same folder with a real heartbeat reads it
    os.rmdir(heartbeat_path(tmp_path))
    write_heartbeat(tmp_path, HB)
    assert read_heartbeat(tmp_path) == HB


def test_a_reader_racing_the_writer_sees_whole_heartbeats_only(tmp_path: Path) -> None:
    seen = set()
    for step in range(300):
        write_heartbeat(tmp_path, Heartbeat(step, step * 1.0, 600.0, None, None, 1.0 + step))
        hb = read_heartbeat(tmp_path)
        assert hb is not None and hb.loop_seconds == hb.step * 1.0
        seen.add(hb.step)
    assert len(seen) == 300


def test_hung_rule() -> None:
    now = 10_000.0
    assert not is_hung(now - HUNG_AFTER_SECONDS + 1, now)
    assert is_hung(now - HUNG_AFTER_SECONDS - 1, now)
    assert is_hung(now - 31, now, 30.0) and not is_hung(now - 29, now, 30.0)
    assert not is_hung(None, now)


def test_hung_after_comes_from_the_environment() -> None:
    base = {"GGPO_DATA_DIR": "/tmp/x", "GGPO_USER": "t"}
    assert load_settings(base).hung_after_seconds == HUNG_AFTER_SECONDS
    assert load_settings({**base, "GGPO_HUNG_AFTER_SECONDS": "90"}).hung_after_seconds == 90.0
    from ggpo_batch.errors import ConfigError

    for bad in ("0", "-5", "soon"):
        with pytest.raises(ConfigError, match="GGPO_HUNG_AFTER_SECONDS"):
            load_settings({**base, "GGPO_HUNG_AFTER_SECONDS": bad})


# -- in the ledger and in status --------------------------------------------------------------------

KEYS = ("hb-v1-1-fresh", "hb-v1-2-stopped", "hb-v1-3-silent", "hb-v1-4-starting", "hb-v1-5-done")


def _running_runs(db_url: str):  # type: ignore[no-untyped-def]
    """Five runs: four running (started 20 min ago), one succeeded."""
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    led.create_experiment(name="hb", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                          actor="t", runs=[NewRun(run_key=k, arm=k.rsplit("-", 1)[1], seed=i, config_hash="c",
                                                  run_spec={}) for i, k in enumerate(KEYS)])
    started = datetime.fromtimestamp(time.time() - 1200, tz=UTC)
    for k in KEYS:
        led.begin_attempt(k, executor="local", gpus=4, actor="t", worker="w")
        led.mark_submitted(k, 1, job_id=f"j-{k}", actor="t")
        led.mark_running(k, 1, actor="t", started_at=started)
    return led


def _attempt(led, key: str):  # type: ignore[no-untyped-def]
    return led.get_run(key).attempts[-1]


def _beat(step: int, age: float) -> Heartbeat:
    return Heartbeat(step=step, loop_seconds=1830.0, budget_seconds=2700.0, mean_reward=0.5, tokens_per_second=900.0,
                     updated_at=time.time() - age)


def test_heartbeats_in_the_ledger_flag_the_stopped_one_and_not_the_fresh(env: dict[str, str], db_url: str) -> None:
    led = _running_runs(db_url)
    a = {k: _attempt(led, k) for k in KEYS}
    # the last run ends before its heartbeat arrives: an ended attempt takes no heartbeat
    led.mark_finished(KEYS[4], 1, attempt_state="succeeded", run_state="succeeded", actor="t")
    led.record_heartbeats([(a[KEYS[0]].id, _beat(41, 3)), (a[KEYS[1]].id, _beat(12, 14 * 60)),
                           (a[KEYS[4]].id, _beat(99, 1))])
    # an older heartbeat never replaces a newer one (two reconcilers, a requeued job's old file)
    led.record_heartbeats([(a[KEYS[0]].id, _beat(40, 30))])
    assert attempt_heartbeat(_attempt(led, KEYS[0])).step == 41
    assert attempt_heartbeat(_attempt(led, KEYS[4])) is None

    [exp] = experiment_status(led, attention=True, limit=20)
    rows = {r["run_key"]: r for r in exp["runs"]}
    fresh, stopped, silent, starting = (rows[k] for k in KEYS[:4])
    assert fresh["hung"] is False and fresh["heartbeat"]["step"] == 41
    assert state_label(fresh) == "running  step 41  1830/2700 s"
    assert stopped["hung"] is True and state_label(stopped) == "running, heartbeat stopped 14 min ago"
    # no heartbeat 20 min after its start: hung too (stuck in set-up, e.g. a collective that never met)
    assert silent["hung"] is True and state_label(silent) == "running, no heartbeat 20 min after start"
    assert exp["hung_runs"] == 3
    # the runs silent the longest lead the running ones
    assert [r["run_key"] for r in exp["runs"]][:3] == [KEYS[2], KEYS[3], KEYS[1]]
    assert starting["heartbeat"] is None
    # a longer threshold: only the 20-minute silences are hung
    [exp] = experiment_status(led, attention=True, limit=20, hung_after=15 * 60)
    assert exp["hung_runs"] == 2 and not {r["run_key"]: r for r in exp["runs"]}[KEYS[1]]["hung"]
    led.engine.dispose()


def test_the_sql_rule_and_the_python_rule_agree(env: dict[str, str], db_url: str) -> None:
    """`ledger.heartbeats.HUNG_SINCE` (counts, order) and `heartbeat.is_hung` (flags) are one rule."""
    led = _running_runs(db_url)
    for i, age in enumerate((5.0, 500.0, 700.0, 5000.0)):
        led.record_heartbeats([(_attempt(led, KEYS[i]).id, _beat(i, age))])
    for hung_after in (1.0, 100.0, 600.0, 1000.0, 6000.0):
        [exp] = experiment_status(led, attention=True, limit=20, hung_after=hung_after)
        flagged = sum(r["hung"] for r in exp["runs"])
        assert exp["hung_runs"] == flagged, hung_after
    led.engine.dispose()


def test_status_shows_progress_and_flags_a_stopped_heartbeat(env: dict[str, str], db_url: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGPO_REDIS_URL", "memory://")
    led = _running_runs(db_url)
    led.record_heartbeats([(_attempt(led, KEYS[0]).id, _beat(41, 3)), (_attempt(led, KEYS[1]).id, _beat(12, 14 * 60))])
    led.engine.dispose()
    out = CliRunner().invoke(cli, ["status"], catch_exceptions=False).output
    assert "running  step 41  1830/2700 s" in out
    assert "running, heartbeat stopped 14 min ago" in out
    assert "4 running run(s) silent for over 600 s: hung?" in out  # the stopped one and three with none
    data = json.loads(CliRunner().invoke(cli, ["status", "--json"], catch_exceptions=False).output)
    rows = {r["run_key"]: r for r in data["experiments"][0]["runs"]}
    assert rows[KEYS[0]]["heartbeat"]["step"] == 41 and rows[KEYS[0]]["heartbeat"]["mean_reward"] == 0.5
    assert rows[KEYS[0]]["hung"] is False and rows[KEYS[1]]["hung"] is True
    assert 14 * 60 <= rows[KEYS[1]]["silent_seconds"] < 15 * 60
    # the threshold is the operator's: an hour, and nothing is hung
    monkeypatch.setenv("GGPO_HUNG_AFTER_SECONDS", "3600")
    data = json.loads(CliRunner().invoke(cli, ["status", "--json"], catch_exceptions=False).output)
    assert data["experiments"][0]["hung_runs"] == 0
