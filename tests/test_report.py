from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.control import costguard
from ggpo_batch.control.importer import import_results
from ggpo_batch.errors import LedgerError
from ggpo_batch.ledger import NewRun
from ggpo_batch.reporting.plots import write_plots
from ggpo_batch.reporting.report import experiment_report
from tests.support.paths import SEED_000

NAME = "seed000"


def _by_arm() -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for rec in json.loads(SEED_000.read_text()).values():
        out[rec["arm"]].append(rec)
    return out


def _exact(values: list) -> dict:
    return {"mean": math.fsum(values) / len(values), "std": statistics.stdev(values), "n": len(values)}


def test_per_arm_figures_match_the_seed_file_exactly(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="t", name=NAME)
    rep = experiment_report(ledger, NAME)
    assert rep["baseline"] == "clean" and rep["version"] == 1
    file_arms = _by_arm()
    assert set(rep["arms"]) == set(file_arms)
    for arm, recs in file_arms.items():
        a = rep["arms"][arm]
        assert a["runs"] == 3 and a["states"] == {"succeeded": 3}
        assert a["steps"] == _exact([r["training"]["counts"]["steps"] for r in recs])
        gh = [r["timing"]["allocated_gpu_hours_through_evaluation"] for r in recs]
        assert a["allocated_gpu_hours"] == {**_exact(gh), "total": math.fsum(gh)}
        assert a["overshoot_fraction"] == _exact([r["budget"]["overshoot_fraction"] for r in recs])
        assert a["elapsed_seconds"] == _exact([r["timing"]["elapsed_seconds"] for r in recs])
        for key in recs[0]["training"]["cost"]:
            vals = [r["training"]["cost"][key] for r in recs]
            assert a["tokens"][key] == {**_exact(vals), "total": math.fsum(vals)}, (arm, key)
        for key in ("actual_exposed", "exposed_with_nonzero_advantage", "shared_groups"):
            assert a["exposure"][key] == _exact([r["training"]["counts"][key] for r in recs])
        assert a["exposure"]["target_exposed"] == _exact([r["budget"]["target_exposed"] for r in recs])
        templates: dict[str, int] = defaultdict(int)
        for r in recs:
            for t, n in r["budget"]["exposure_templates"].items():
                templates[t] += n
        assert a["exposure_templates"] == dict(templates)
        for r in recs:
            assert a["per_seed"][str(r["seed"])]["steps"] == r["training"]["counts"]["steps"]
        # The padding ratio: the update's padded tokens over its non-padded ones, summed over the arm's runs.
        padded, real = (math.fsum(r["training"]["cost"][k] for r in recs)
                        for k in ("rl_sequence_padded_tokens", "rl_sequence_nonpadding_tokens"))
        assert a["padding_ratio"] == pytest.approx(padded / real, rel=1e-12) and a["padding_ratio"] > 2.0
    # The auxiliary-loss arms carry the aux token counts; the others do not invent them.
    assert "aux_loss_tokens" in rep["arms"]["paired_answer"]["tokens"]
    assert "aux_loss_tokens" not in rep["arms"]["clean"]["tokens"]
    spent = [r["timing"]["allocated_gpu_hours_through_evaluation"] for rs in file_arms.values() for r in rs]
    assert rep["totals"]["spent_gpu_hours"] == math.fsum(spent)
    assert rep["totals"]["spent_gpu_hours"] == pytest.approx(57.29736219114727, rel=1e-12)
    assert rep["totals"]["decided_not_spent_gpu_hours"] == 0.0 and rep["totals"]["attempts"] == 15


def test_differences_are_paired_by_seed(ledger) -> None:  # type: ignore[no-untyped-def]
    import_results(ledger, SEED_000, actor="t", name=NAME)
    rep = experiment_report(ledger, NAME)
    arms = _by_arm()
    clean = {r["seed"]: r for r in arms["clean"]}
    assert set(rep["paired_vs_baseline"]) == {"paired", "random_matched", "paired_answer", "random_answer"}
    for arm, recs in arms.items():
        if arm == "clean":
            continue
        d = rep["paired_vs_baseline"][arm]
        assert d["seeds"] == sorted(clean)
        steps = {str(r["seed"]): r["training"]["counts"]["steps"] - clean[r["seed"]]["training"]["counts"]["steps"]
                 for r in recs}
        assert d["steps"]["per_seed"] == steps
        assert d["steps"]["mean"] == math.fsum(steps.values()) / 3
        gen = [r["training"]["cost"]["backend_generated_tokens"]
               - clean[r["seed"]]["training"]["cost"]["backend_generated_tokens"] for r in recs]
        assert d["backend_generated_tokens"]["std"] == statistics.stdev(gen)
    # paired_answer ran 68/66/68 steps against clean's 78/74/73: fewer steps in the same loop time.
    assert rep["paired_vs_baseline"]["paired_answer"]["steps"]["mean"] < 0
    # Another baseline works the same way; an absent one yields no differences.
    assert set(experiment_report(ledger, NAME, baseline="paired")["paired_vs_baseline"]) == {
        "clean", "random_matched", "paired_answer", "random_answer"}
    none = experiment_report(ledger, NAME, baseline="nope")
    assert none["baseline"] is None and none["paired_vs_baseline"] == {}


def test_failed_attempts_cost_but_do_not_count_as_steps(ledger) -> None:  # type: ignore[no-untyped-def]
    runs = [NewRun(run_key=f"r-v1-{s}-{arm}", arm=arm, seed=s, config_hash="h", run_spec={}, estimated_gpu_hours=2.0)
            for s in (1, 2) for arm in ("clean", "paired")]
    ledger.create_experiment(name="r", version=1, method="ggpo", source="spec", spec_hash="r", spec={}, gpus=4,
                             actor="t", runs=runs)

    def attempt(key: str, n: int, state: str, hours: float, steps: int | None) -> None:
        ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker="w")
        ledger.mark_submitted(key, n, job_id=f"{key}-{n}", actor="w")
        result = None if steps is None else {"training": {"counts": {"steps": steps}}, "budget": {}, "timing": {}}
        ledger.mark_finished(key, n, attempt_state=state, run_state=state, actor="w", gpu_hours_job=hours,
                             gpu_hours_scheduler=hours, result=result)

    attempt("r-v1-1-clean", 1, "succeeded", 1.5, 10)
    attempt("r-v1-2-clean", 1, "failed", 0.25, None)
    ledger.requeue("r-v1-2-clean", actor="t", reason="manual retry after fixing the node")
    attempt("r-v1-2-clean", 2, "succeeded", 1.25, 14)
    attempt("r-v1-1-paired", 1, "succeeded", 1.0, 7)
    attempt("r-v1-2-paired", 1, "failed", 0.5, None)
    rep = experiment_report(ledger, "r")
    clean, paired = rep["arms"]["clean"], rep["arms"]["paired"]
    assert clean["allocated_gpu_hours"]["total"] == 1.5 + 0.25 + 1.25 and clean["attempts"] == 3
    assert clean["steps"] == {"mean": 12.0, "std": statistics.stdev([10, 14]), "n": 2}
    assert paired["allocated_gpu_hours"]["total"] == 1.5 and paired["states"] == {"failed": 1, "succeeded": 1}
    assert paired["steps"] == {"mean": 7.0, "std": None, "n": 1}
    assert rep["paired_vs_baseline"]["paired"]["seeds"] == [1]
    assert rep["paired_vs_baseline"]["paired"]["steps"]["per_seed"] == {"1": -3}
    assert rep["totals"]["spent_gpu_hours"] == 4.5


def test_decided_only_and_unknown_experiments(ledger) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(LedgerError, match="no experiment 'ghost'"):
        experiment_report(ledger, "ghost")
    costguard.decide_not_reproduced(ledger, "paper-full", actor="carol", reason="paper setup",
                                    cost_basis="4 GH200", estimated_gpu_hours=3000.0)
    rep = experiment_report(ledger, "paper-full")
    assert rep["arms"] == {} and rep["version"] is None
    assert rep["totals"]["decided_not_spent_gpu_hours"] == 3000.0 and rep["totals"]["spent_gpu_hours"] == 0
    assert rep["decisions"][0]["review_done"] is True
    import_results(ledger, SEED_000, actor="t", name=NAME)
    with pytest.raises(LedgerError, match="no version 7"):
        experiment_report(ledger, NAME, version=7)


def test_plots_are_written_and_not_blank(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from matplotlib.image import imread

    import_results(ledger, SEED_000, actor="t", name=NAME)
    paths = write_plots(experiment_report(ledger, NAME), tmp_path / "plots")
    assert [p.name for p in paths] == ["gpu_hours_per_arm.png", "steps_per_arm.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = imread(p)
        assert img.shape[0] >= 500 and img.shape[1] >= 900  # readable size at 120 dpi
        assert float(img[..., :3].std()) > 0.05  # bars, points and text, not an empty canvas
    assert write_plots({"arms": {}, "experiment": "x"}, tmp_path / "empty") == []  # nothing ran: no plots


def _cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_report_decide_and_status(env: dict[str, str], tmp_path: Path) -> None:
    assert _cli("db", "upgrade").exit_code == 0
    assert _cli("ledger", "import", str(SEED_000), "--name", NAME).exit_code == 0
    res = _cli("report", NAME, "--json", "--plot", str(tmp_path / "p"))
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["arms"]["clean"]["steps"]["n"] == 3 and len(data["plots"]) == 2
    assert all(Path(p).stat().st_size > 10_000 for p in data["plots"])
    table = _cli("report", NAME)
    assert table.exit_code == 0 and "paired by seed" in table.output and "57.2974" in table.output
    ratio = data["arms"]["clean"]["padding_ratio"]
    assert "padded/tok" in table.output  # the cost table's column, the clean arm's ratio in its row
    assert any("clean" in line and f" {ratio:.2f} " in line for line in table.output.splitlines()), table.output
    assert _cli("report", "ghost").exit_code == 2

    # A run that failed and runs decided not to reproduce: status keeps them apart.
    runs = [NewRun(run_key=f"big-v1-{i}-clean", arm="clean", seed=i, config_hash="h", run_spec={},
                   estimated_gpu_hours=50.0) for i in range(3)]
    from ggpo_batch.ledger import connect

    led = connect(env["GGPO_DB_URL"])
    led.create_experiment(name="big", version=1, method="ggpo", source="spec", spec_hash="b", spec={}, gpus=4,
                          actor="tester", runs=runs)
    led.begin_attempt("big-v1-0-clean", executor="debug", gpus=4, actor="w", worker="w")
    led.mark_submitted("big-v1-0-clean", 1, job_id="9", actor="w")
    led.mark_finished("big-v1-0-clean", 1, attempt_state="failed", run_state="failed", actor="w", reason="OOM",
                      gpu_hours_job=0.1)
    led.engine.dispose()
    res = _cli("decide", "big", "--reason", "review: too expensive")
    assert res.exit_code == 2 and "--cost-basis" in res.output
    res = _cli("decide", "big", "--reason", "review: too expensive", "--cost-basis", "3 x 50 GPU-h")
    assert res.exit_code == 2 and "--not-reproduced" in res.output
    res = _cli("decide", "big", "--not-reproduced", "--reason", "review: too expensive", "--cost-basis",
               "3 x 50 GPU-h")
    assert res.exit_code == 0 and "2 queued runs marked not_reproduced" in res.output
    assert _cli("decide", "paper-full", "--not-reproduced", "--reason", "paper", "--cost-basis", "4 GH200",
                "--estimated-gpu-hours", "3000").exit_code == 0
    st = json.loads(_cli("status", "--json").output)
    big = next(e for e in st["experiments"] if e["experiment"] == "big")
    assert big["totals"]["states"] == {"failed": 1, "not_reproduced": 2} and big["decided_runs"] == 2
    assert big["estimated_gpu_hours"] == 150.0
    assert [d["experiment"] for d in st["decided"]] == ["paper-full"]
    out = _cli("status", "-e", "big", "--runs").output  # every run: the decided ones listed apart
    assert out.index("OOM") < out.index("decided") < out.index("not_reproduced   ")
    default = _cli("status", "-e", "big").output  # the default view lists what needs a look
    assert "OOM" in default and "2 not_reproduced" in default and "not_reproduced   " not in default
    assert "not reproduced: no GPU spent, not failed" in out
    assert "decided, never queued" in _cli("status").output
    assert json.loads(_cli("status", "--json", "--state", "failed").output)["decided"] == []
    rep = json.loads(_cli("report", "big", "--json").output)
    assert rep["totals"]["decided_not_spent_gpu_hours"] == 100.0 and rep["totals"]["spent_gpu_hours"] == 0.1
