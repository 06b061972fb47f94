"""Secrets in text a user typed or a job printed never reach output: the configured passwords (the
ledger's, MLflow's) and the dashboard's token, quoted in a decision's reason and cost basis, in a
failed attempt's cause and in a job's log, are masked by every command that shows them -- `status`
(tables, JSON), `report` (text, JSON, Markdown, HTML files), `logs` (whole, tail, followed to the
end), `ledger export` (CSV and JSON, stdout and file) -- as the dashboard masks them
(ggpo_batch/config/masking.py, one place). On SQLite, and on PostgreSQL reached with a password (the test
server trusts every connection, so any password is accepted, and must stay hidden)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.ledger import NewRun, connect, upgrade
from ggpo_batch.ledger.db import make_engine
from ggpo_batch.reporting.joblogs import log_path

DB_PW = "Db-pw-8Qz1-masked"
MLFLOW_PW = "Ml-pw-3Kx9-masked"
TOKEN = "Tok-7Hv2-dashboard-token-masked"
KEY = "sec-v1-1-clean"


def _quoted() -> str:
    """What a user pastes into a reason, or a job prints: every secret, in a URL and bare."""
    return (f"the ledger at postgresql://ggpo:{DB_PW}@db.example/ledger refused us; mlflow password {MLFLOW_PW}; "
            f"dashboard token {TOKEN}")


def _leaks(text: str) -> list[str]:
    """The configured secrets (or their first 8 characters: a cell cut short) found in `text` (the
    ledger's password is one on PostgreSQL; a SQLite ledger has none, and DB_PW is then just text)."""
    known = (MLFLOW_PW, TOKEN, *((DB_PW,) if DB_PW in os.environ["GGPO_DB_URL"] else ()))
    return [s for s in known if s[:8] in text]


@pytest.fixture
def secret_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    url = db_url.replace("postgres@", f"postgres:{DB_PW}@") if db_url.startswith("postgresql") else db_url
    values = {"GGPO_DB_URL": url, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester",
              "GGPO_REDIS_URL": "memory://", "GGPO_MLFLOW_URI": f"postgresql://mlflow:{MLFLOW_PW}@127.0.0.1:9/m",
              "GGPO_DASHBOARD_TOKEN": TOKEN}
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    engine = make_engine(db_url)
    upgrade(engine)
    engine.dispose()
    led = connect(db_url)
    try:
        led.create_experiment(name="sec", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                              actor="t", runs=[NewRun(run_key=KEY, arm="clean", seed=1, config_hash="c", run_spec={})])
        led.begin_attempt(KEY, executor="local", gpus=4, actor="t", worker="host.1")
        led.mark_submitted(KEY, 1, job_id="77", actor="t")
        # the cause is cut at 60 characters in the status table: the password straddles the cut
        led.mark_finished(KEY, 1, attempt_state="failed", run_state="failed", actor="t",
                          reason="x" * 49 + f" {DB_PW} " + _quoted())
    finally:
        led.engine.dispose()
    folder = attempt_folder(tmp_path / "data" / "jobs", KEY, 1)
    folder.mkdir(parents=True)
    log_path(folder, "77", 0, "stderr").write_text(f"step 1\nTraceback: {_quoted()}\n\rprogress {TOKEN}\rdone\n")
    log_path(folder, "77", 0, "stdout").write_text("hello\n")
    return values


def _run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, (args, res.output)
    return res.output + (res.stderr or "")


def test_every_output_masks_the_secrets_users_and_jobs_quote(secret_env: dict[str, str], tmp_path: Path) -> None:
    outputs = {"decide": _run("decide", "sec", "--not-reproduced", "--reason", _quoted(), "--cost-basis",
                              _quote_basis(), "--cost-type", f"judged with {TOKEN}")}
    for args in (["status"], ["status", "--runs"], ["status", "--json"], ["status", "--state", "failed"],
                 ["report", "sec"], ["report", "sec", "--json"], ["logs", KEY], ["logs", KEY, "-n", "2"],
                 ["logs", KEY, "-f"],  # the attempt has ended: followed to its end at once
                 ["ledger", "export", "--format", "csv", "--table", "attempts"], ["ledger", "export", "--format", "json"]):
        outputs[" ".join(args)] = _run(*args)
    for fmt in ("md", "html", "json"):
        out = tmp_path / f"report.{fmt}"
        outputs[f"report -o {fmt}"] = _run("report", "sec", "--format", fmt, "-o", str(out)) + out.read_text()
    export = tmp_path / "attempts.csv"
    outputs["export -o"] = _run("ledger", "export", "--format", "csv", "--table", "attempts", "-o", str(export)) \
        + export.read_text()
    shown = {name: text for name, text in outputs.items() if "***" in text}
    assert set(shown) >= {"status", "status --json", "report sec", "logs " + KEY, "report -o md", "report -o html",
                          "ledger export --format json", "export -o"}, sorted(set(outputs) - set(shown))
    assert {name: _leaks(text) for name, text in outputs.items() if _leaks(text)} == {}


def _quote_basis() -> str:
    return f"quoted from postgresql://ggpo:{DB_PW}@db.example/ledger"


def test_the_secrets_of_the_environment_are_masked_even_where_a_command_does_not_read_them(
        secret_env: dict[str, str]) -> None:
    """`logs` never opens MLflow nor the dashboard: their secrets are still known to its output."""
    text = _run("logs", KEY, "--stream", "stderr")
    assert "progress ***" in text and not _leaks(text)
