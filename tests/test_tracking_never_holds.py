"""Tracking never holds training (ggpo_batch/train/run/tracking.py): with GGPO_MLFLOW_URI at a closed port, at
a server that accepts and never answers, or at a PostgreSQL server that refuses the store, the
attempt's tracking goes off within a bound -- one warning, the reason beside the record, the URI's
password in no log or file -- and a one-run `train` ends within its usual time plus a minute (the old
code was still opening its MLflow run after 150 s)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from ggpo_batch.common.netutil import free_port
from ggpo_batch.contracts.runspec import RunSpec
from ggpo_batch.train.run import tracking
from ggpo_batch.train.run.tracking import Tracking, off_path, run_id_path, tracking_state
from tests.faults.test_hostile_inputs import silent_port  # noqa: F401  (a fixture: a port that never answers)
from tests.support.arms import ARMS
from tests.support.paths import REPO
from tests.support.services import PG_ADMIN_URL

PASSWORD = "Mlflow-pw-5Tq8-secret"


def _refusing_postgres() -> str:
    """The test PostgreSQL server, a database it does not have: it answers, and refuses the store."""
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgres@", f"postgres:{PASSWORD}@")
    return f"{base}/ggpo_no_such_mlflow_db"


def _stores(port: int) -> dict[str, str]:
    """The unusable stores, the silent one at `port`."""
    return {"closed port": f"http://ggpo:{PASSWORD}@127.0.0.1:{free_port()}",
            "silent server": f"http://ggpo:{PASSWORD}@127.0.0.1:{port}",
            "postgresql refuses": _refusing_postgres()}


def _spec() -> RunSpec:
    return RunSpec(run_key="trk-off-v1-7-paired", experiment="trk-off", experiment_version=1, method="ggpo",
                   arm=ARMS["paired"], seed=7, gpus=4, loop_budget_seconds=3.0, executor="local", profile="default",
                   train={})


@pytest.mark.parametrize("case", ["closed port", "silent server", "postgresql refuses"])
def test_an_unusable_store_turns_tracking_off_within_its_bound(case: str, silent_port: int, tmp_path: Path,  # noqa: F811
                                                              caplog: pytest.LogCaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.config.settings import mlflow_uri

    monkeypatch.setattr(tracking, "OPEN_WAIT_SECONDS", 3.0)  # the job's bounds are 20 s and 25 s; the path is the same
    uri = _stores(silent_port)[case]
    assert mlflow_uri({"GGPO_MLFLOW_URI": uri}) == uri  # as the job reads it: its password remembered
    record = tmp_path / "attempt-1" / "record.json"
    caplog.set_level(logging.WARNING)
    t0 = time.monotonic()
    t = Tracking.start(uri, _spec(), record)
    if case == "closed port":
        assert t is None and time.monotonic() - t0 < 6.0  # found at once, not after MLflow's retries
    else:  # still opening after its wait: it goes on beside training, and the end waits for it at most its bound
        assert t is not None and not t.off and time.monotonic() - t0 < 6.0
        t.log_steps([{"step": 1, "loss": 0.5}])  # handed over, not waited for
        t.settle(2.0)
        assert t.off and time.monotonic() - t0 < 10.0
        t.finish([])  # off: nothing more waits
    warnings = [r for r in caplog.records if r.name == "ggpo_batch.train.run.tracking" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "MLflow tracking off for this attempt" in warnings[0].getMessage()
    state = tracking_state(record)
    assert state["state"] == "off" and state["reason"], state
    assert not run_id_path(record).exists()
    assert PASSWORD not in caplog.text and PASSWORD not in off_path(record).read_text()


def test_a_store_that_stops_answering_mid_run_costs_the_end_at_most_its_bound(tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SQLite store, opened; then locked by another connection: the step's metrics are handed over
    without waiting, the end waits at most FINISH_TIMEOUT_SECONDS, and tracking is marked off."""
    import sqlite3

    monkeypatch.setattr(tracking, "FINISH_TIMEOUT_SECONDS", 1.0)
    db = tmp_path / "mlflow.db"
    record = tmp_path / "attempt-1" / "record.json"
    t = Tracking.start(f"sqlite:///{db}", _spec(), record)
    assert t is not None
    t.settle(120.0)  # a new store builds its schema: seconds, more on a loaded machine
    assert tracking_state(record)["state"] == "on"
    lock = sqlite3.connect(db, timeout=0, isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        for step in range(1, 4):
            t.log_steps([{"step": step, "loss": 1.0 / step}])
        assert time.monotonic() - t0 < 0.5  # handed to the tracking thread
        t0 = time.monotonic()
        t.finish([])
        assert time.monotonic() - t0 < 3.0
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert tracking_state(record)["state"] == "off" and "MLflow tracking off" in caplog.text


# -- a one-run `train`, tracking unreachable against tracking off ------------------------------------

SPEC = """[experiment]
name = "trk-train"
method = "ggpo"
seeds = [7]
gpus = 4
executor = "local"
loop_budget_seconds = 3
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[train]
eval_size = 4
[arms.clean]
exposure = "none"
"""


def _train(tmp_path: Path, name: str, uri: str | None) -> tuple[float, subprocess.CompletedProcess[str], Path]:
    spec = tmp_path / "trk-train.toml"
    spec.write_text(SPEC)
    out = tmp_path / name / "record.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_") or k.startswith("GGPO_TEST_")}
    env["GGPO_DATA_DIR"] = str(tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if uri:
        env["GGPO_MLFLOW_URI"] = uri
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "train", str(spec), "--arm", "clean", "--seed", "7",
                           "--nproc", "1", "-o", str(out)], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=600, check=False)
    return time.monotonic() - t0, done, out


@pytest.mark.train
@pytest.mark.slow
def test_train_with_tracking_unreachable_ends_within_a_minute_of_train_without(tmp_path: Path,
                                                                              silent_port: int) -> None:  # noqa: F811
    off_seconds, done, _ = _train(tmp_path, "off", None)
    assert done.returncode == 0, done.stderr[-3000:]
    seconds, done, out = _train(tmp_path, "silent", _stores(silent_port)["silent server"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert seconds < off_seconds + 60, (seconds, off_seconds)
    details = json.loads(out.with_name("record.json.details.json").read_text())
    assert details["tracking"]["state"] == "off" and "did not answer in 25 s" in details["tracking"]["reason"]
    logs = done.stderr + "".join(p.read_text(errors="replace") for p in out.parent.glob("*.log"))
    assert logs.count("MLflow tracking off for this attempt") == 1, logs[-3000:]
    for f in out.parent.rglob("*"):
        if f.is_file():
            assert PASSWORD.encode() not in f.read_bytes(), f
    assert PASSWORD not in done.stdout + done.stderr
