"""`status` and `report` show runs whose rollout audit failed (and runs short of their budget or
exposure target) apart from clean ones, whichever way the record reached the ledger."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.run_record import BUDGET_STATUS_SHORT, TRAINING_STATUS_AUDIT_FAILED, check_results_file
from ggpo_batch.control.importer import import_results
from ggpo_batch.reporting.report import experiment_report
from ggpo_batch.reporting.status import experiment_status
from tests.support.paths import SEED_000

AUDIT_FAILED_KEY = "20261013/paired"
SHORT_KEY = "20261014/random_matched"


def _planted(tmp_path: Path) -> Path:
    """The seed file with one run's audit failed and another run short of its exposure target."""
    data = json.loads(SEED_000.read_text())
    bad = copy.deepcopy(data)
    bad[AUDIT_FAILED_KEY]["training"]["status"] = TRAINING_STATUS_AUDIT_FAILED
    b = bad[SHORT_KEY]["budget"]
    b.update(target_exposed=b["actual_exposed"] + 100, exposure_target_reached=False,
             matched_interpretation_allowed=False, status=BUDGET_STATUS_SHORT)
    assert check_results_file(bad) == []  # both are valid records: the stamps say what happened
    path = tmp_path / "planted.json"
    path.write_text(json.dumps(bad))
    return path


def test_status_and_report_keep_audit_failed_runs_apart(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, _planted(tmp_path), actor="t", name="planted")
    [exp] = experiment_status(ledger)
    rows = {f"{r['seed']}/{r['arm']}": r for r in exp["runs"]}
    failed = rows[AUDIT_FAILED_KEY]
    assert failed["state"] == "succeeded"  # the allocation finished and wrote a valid record ...
    assert failed["audit_failed"] is True and failed["training_status"] == TRAINING_STATUS_AUDIT_FAILED  # ... shown
    assert rows[SHORT_KEY]["budget_reconciled"] is False and rows[SHORT_KEY]["audit_failed"] is False
    clean = [r for k, r in rows.items() if k not in (AUDIT_FAILED_KEY, SHORT_KEY)]
    assert all(not r["audit_failed"] and r["budget_reconciled"] for r in clean)
    assert exp["totals"]["audit_failed"] == 1 and exp["totals"]["budget_not_reconciled"] == 1
    assert exp["arms"]["paired"]["audit_failed"] == 1 and exp["arms"]["clean"]["audit_failed"] == 0

    rep = experiment_report(ledger, "planted")
    paired = rep["arms"]["paired"]
    assert paired["audit_failed"] == 1 and paired["steps"]["n"] == 2  # left out of the statistics
    assert paired["per_seed"]["20261013"]["audit_failed"] is True and paired["per_seed"]["20261013"]["steps"] is None
    assert paired["allocated_gpu_hours"]["n"] == 3  # its GPU-hours were spent all the same
    assert 20261013 not in rep["paired_vs_baseline"]["paired"]["seeds"]
    assert rep["arms"]["random_matched"]["budget_not_reconciled"] == 1
    assert rep["totals"]["audit_failed_runs"] == 1 and rep["totals"]["budget_not_reconciled_runs"] == 1
    assert math.isclose(rep["totals"]["spent_gpu_hours"], 57.2974, abs_tol=5e-5)


def test_clean_seed_file_has_no_run_apart(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="t", name="seed000")
    [exp] = experiment_status(ledger)
    assert exp["totals"]["audit_failed"] == 0 and exp["totals"]["budget_not_reconciled"] == 0
    assert exp["totals"]["states"] == {"succeeded": 15}
    rep = experiment_report(ledger, "seed000")
    assert rep["totals"]["audit_failed_runs"] == 0 and all(a["steps"]["n"] == 3 for a in rep["arms"].values())


def test_cli_tables_say_so(env: dict[str, str], tmp_path: Path) -> None:
    def run(*args: str) -> str:
        res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.output

    run("db", "upgrade")
    run("ledger", "import", str(_planted(tmp_path)), "--name", "planted")
    table = run("status", "-e", "planted")
    assert "succeeded, audit failed" in table and "ROLLOUT AUDIT FAILED" in table
    assert "budget/exposure short" in table and "(1 audit failed)" in table  # (the note cell wraps)
    st = json.loads(run("status", "--json"))
    [row] = [r for e in st["experiments"] for r in e["runs"] if r["audit_failed"]]
    assert (row["seed"], row["arm"]) == (20261013, "paired")
    report = run("report", "planted")
    assert "rollout audit failed: 1 succeeded runs (paired 1)" in " ".join(report.split())
    assert "budget or exposure target not reached: 1 runs" in " ".join(report.split())
