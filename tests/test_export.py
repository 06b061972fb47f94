from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common.schemas import SCHEMAS
from ggpo_batch.control.importer import import_results
from ggpo_batch.errors import LedgerError
from ggpo_batch.ledger import NewRun
from ggpo_batch.reporting.export import ATTEMPT_COLUMNS, RUN_COLUMNS, export_ledger
from tests.support.paths import SEED_000


def _seed() -> dict:
    return json.loads(SEED_000.read_text())


def test_csv_runs_round_trip_the_seed_figures(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="t", name="seed000")
    buf = io.StringIO()
    assert export_ledger(ledger, buf, fmt="csv") == 15
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert tuple(rows[0]) == RUN_COLUMNS and len(rows) == 15
    seed = _seed()
    for row in rows:
        rec = seed[f"{row['seed']}/{row['arm']}"]
        assert float(row["allocated_gpu_hours"]) == rec["timing"]["allocated_gpu_hours_through_evaluation"]
        assert float(row["overshoot_fraction"]) == rec["budget"]["overshoot_fraction"]
        assert int(row["steps"]) == rec["training"]["counts"]["steps"]
        assert int(row["cost.backend_generated_tokens"]) == rec["training"]["cost"]["backend_generated_tokens"]
        assert row["state"] == "succeeded" and row["estimated_gpu_hours"] == ""
        has_aux = "aux_loss_tokens" in rec["training"]["cost"]
        assert (row["cost.aux_loss_tokens"] != "") == has_aux
    total = math.fsum(float(r["allocated_gpu_hours"]) for r in rows)
    assert total == pytest.approx(57.29736219114727, rel=1e-12)


def test_csv_attempts_and_json_both_tables(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="t", name="seed000")
    buf = io.StringIO()
    assert export_ledger(ledger, buf, fmt="csv", table="attempts") == 15
    rows = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert tuple(rows[0]) == ATTEMPT_COLUMNS
    assert {r["executor"] for r in rows} == {"import"} and {r["number"] for r in rows} == {"1"}
    assert {r["accounting_disagreement"] for r in rows} == {"False"}
    buf = io.StringIO()
    assert export_ledger(ledger, buf, fmt="json") == 30
    data = json.loads(buf.getvalue())
    assert data["schema"] == SCHEMAS["ledger_export"].number and len(data["runs"]) == 15 and len(data["attempts"]) == 15
    assert set(data["runs"][0]) == set(RUN_COLUMNS) and set(data["attempts"][0]) == set(ATTEMPT_COLUMNS)
    assert math.fsum(a["gpu_hours_booked"] for a in data["attempts"]) == pytest.approx(57.29736219114727, rel=1e-12)
    only = io.StringIO()
    export_ledger(ledger, only, fmt="json", table="attempts")
    assert set(json.loads(only.getvalue())) == {"schema", "attempts"}
    with pytest.raises(LedgerError, match="no experiment 'nope'"):
        export_ledger(ledger, io.StringIO(), fmt="csv", experiment="nope")
    with pytest.raises(LedgerError, match="must be one of csv, json"):
        export_ledger(ledger, io.StringIO(), fmt="xlsx")


def test_csv_cells_never_run_as_formulas(ledger) -> None:  # type: ignore[no-untyped-def]
    ledger.create_experiment(name="x", version=1, method="ggpo", source="spec", spec_hash="x", spec={}, gpus=4,
                             actor="t", runs=[NewRun(run_key="x-v1-1-clean", arm="clean", seed=1, config_hash="h",
                                                     run_spec={})])
    ledger.mark_cancelled("x-v1-1-clean", actor="t", reason='=HYPERLINK("http://evil","click")')
    buf = io.StringIO()
    export_ledger(ledger, buf, fmt="csv")
    [row] = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert row["cause"] == "'=HYPERLINK(\"http://evil\",\"click\")"
    js = io.StringIO()
    export_ledger(ledger, js, fmt="json")
    assert json.loads(js.getvalue())["runs"][0]["cause"].startswith("=HYPERLINK")  # JSON keeps the text as is


def test_cli_export_to_file(env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    assert runner.invoke(cli, ["ledger", "import", str(SEED_000)]).exit_code == 0
    out = tmp_path / "runs.csv"
    res = runner.invoke(cli, ["ledger", "export", "--format", "csv", "-o", str(out)])
    assert res.exit_code == 0 and "wrote 15 rows" in res.output
    assert len(list(csv.DictReader(out.open()))) == 15 and not out.with_name("runs.csv.part").exists()
    res = runner.invoke(cli, ["ledger", "export", "--format", "json", "--table", "runs"])
    assert res.exit_code == 0 and len(json.loads(res.output)["runs"]) == 15
    res = runner.invoke(cli, ["ledger", "export", "--format", "csv", "-e", "nope", "-o", str(tmp_path / "n.csv")])
    assert res.exit_code == 2 and "no experiment 'nope'" in res.output
    assert not (tmp_path / "n.csv").exists() and not (tmp_path / "n.csv.part").exists()
    assert runner.invoke(cli, ["ledger", "export", "--format", "xml"]).exit_code == 2


def test_export_never_replaces_a_device_or_fifo(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """-o onto something that is not a regular file is refused: the write-then-rename that keeps a
    reader from seeing half a file would otherwise replace the device (it once replaced /dev/null)."""
    import os

    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    res = runner.invoke(cli, ["ledger", "export", "--format", "csv", "-o", str(fifo)])
    assert res.exit_code == 2 and "not a regular file" in res.output
    assert not fifo.is_file() and fifo.exists()
