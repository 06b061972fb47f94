"""Structured logs (issue 41): GGPO_LOG_FORMAT=json (settings-file key `log_format`) makes every log
line one JSON object, parsed here line by line, with the run's context where known and secrets masked."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

SECRET = "Sekr3t-pw-5521"


@pytest.fixture
def json_logging(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """configure_logging in JSON into a buffer; the root logger and the environment restored after."""
    from ggpo_batch.config import logs

    monkeypatch.setenv("GGPO_DB_URL", f"postgresql://ggpo:{SECRET}@db.example:5432/ledger")  # a remembered secret
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, "text")  # restored (unset) after: configure_logging exports json
    root = logging.getLogger()
    level = root.level
    buf = io.StringIO()
    assert logs.configure_logging(env={logs.LOG_FORMAT_ENV: "json"}, stream=buf, context={"rank": 1}) == "json"
    yield buf
    logging.captureWarnings(False)
    for h in [h for h in root.handlers if isinstance(h, logs._OurHandler)]:
        root.removeHandler(h)
    root.setLevel(level)


def test_json_lines_parse_with_context_and_masked(json_logging: io.StringIO) -> None:
    from ggpo_batch.config.logs import bind, log_context

    log = logging.getLogger("ggpo_batch.test")
    log.info("outside any run")
    with log_context(run_key="exp-v1-3-clean", attempt=2):
        bind(job_id="4711")
        log.warning("submitting to postgresql://ggpo:%s@db.example/ledger", SECRET)
        try:
            raise RuntimeError(f"boom {SECRET}")
        except RuntimeError:
            log.exception("failed")
    log.error("after the run, with a quote \" and a newline\nin it")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library's warning", DeprecationWarning, stacklevel=1)  # a bare stderr line, else
    lines = json_logging.getvalue().splitlines()
    docs = [json.loads(line) for line in lines]  # one JSON object a line, every line
    assert len(docs) == 5 and docs[4]["logger"] == "py.warnings"
    for d in docs:
        assert {"time", "level", "logger", "message"} <= d.keys() and d["time"].endswith("Z")
        assert d["rank"] == 1  # the process's fixed context
    assert "run_key" not in docs[0] and "job_id" not in docs[0]
    assert (docs[1]["run_key"], docs[1]["attempt"], docs[1]["job_id"], docs[1]["level"]) == (
        "exp-v1-3-clean", 2, "4711", "WARNING")
    assert docs[2]["message"] == "failed" and "RuntimeError" in docs[2]["exception"]
    assert "run_key" not in docs[3] and docs[3]["message"].endswith("newline\nin it")
    assert SECRET not in json_logging.getvalue()
    assert "***" in docs[1]["message"] and "***" in docs[2]["exception"]
    assert os.environ["GGPO_LOG_FORMAT"] == "json"  # what the jobs this process starts inherit


def test_job_log_context_from_its_attempt_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ggpo_batch.contracts.allocation import job_log_context, record_path

    monkeypatch.delenv("SUBMITIT_LOCAL_JOB_ID", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "9001")
    output = record_path(tmp_path / "exp-v1-3-clean" / "attempt-3")
    assert job_log_context("exp-v1-3-clean", output, 0) == {"run_key": "exp-v1-3-clean", "attempt": 3,
                                                            "job_id": "9001", "rank": 0}


def test_settings_file_log_format_makes_cli_lines_json(tmp_path: Path) -> None:
    """`log_format = "json"` in a settings file: a command's log lines parse one by one, and
    `config` shows the setting and the file it came from."""
    settings_file = tmp_path / "config.toml"
    settings_file.write_text('log_format = "json"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGPO_")}
    env.update(GGPO_CONFIG=str(settings_file), GGPO_DB_URL=f"sqlite:///{tmp_path / 'none' / 'ledger.sqlite3'}",
               GGPO_REDIS_URL="memory://", GGPO_DATA_DIR=str(tmp_path / "data"), GGPO_USER="tester",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cli = [sys.executable, "-m", "ggpo_batch.cli"]
    done = subprocess.run([*cli, "-vv", "status"], env=env, capture_output=True, text=True, timeout=120, check=False)
    logged = [line for line in done.stderr.splitlines() if line.startswith("{")]
    assert logged, done.stderr
    for line in logged:
        doc = json.loads(line)
        assert {"time", "level", "logger", "message"} <= doc.keys()
    assert any(json.loads(line)["logger"] == "ggpo_batch.ledger.read_only" for line in logged)
    shown = subprocess.run([*cli, "config", "--json"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert shown.returncode == 0, shown.stderr
    row = next(r for r in json.loads(shown.stdout)["settings"] if r["name"] == "GGPO_LOG_FORMAT")
    assert (row["value"], row["source"], row["set_by"], row["file"]) == ("json", "file", "log_format", str(settings_file))
    env["GGPO_LOG_FORMAT"] = "xml"
    refused = subprocess.run([*cli, "config"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 2 and "GGPO_LOG_FORMAT='xml'" in refused.stderr


def test_a_workers_lines_about_a_run_name_it(json_logging: io.StringIO, settings, ledger,  # type: ignore[no-untyped-def]
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's RQ job for a run the ledger does not have: its line says so and names the run."""
    from ggpo_batch.control import worker

    monkeypatch.setattr(worker, "_process", worker._WorkerProcess(settings, ledger))
    logging.getLogger().setLevel(logging.INFO)
    out = worker.execute_run("nosuch-v1-1-a")
    assert "skipped" in out
    [doc] = [json.loads(line) for line in json_logging.getvalue().splitlines()
             if json.loads(line)["logger"] == "ggpo_batch.control.worker"]
    assert doc["run_key"] == "nosuch-v1-1-a" and "not submitted" in doc["message"], doc
