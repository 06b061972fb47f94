"""Outcomes in the report: per-arm intervals, paired differences on the same items, comparability
warnings, plots, `report A B` and the md/html file -- on a 5-arm x 3-seed experiment built in the
ledger with hand-chosen rewards (so every figure below is computed by hand), fair and made unfair.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.contracts.outcome import outcome_from_evaluation
from ggpo_batch.ledger import NewRun
from ggpo_batch.reporting.plots import write_plots
from ggpo_batch.reporting.report import experiment_report
from ggpo_batch.train.run.evaluation import summarize

T2 = 4.302652729749464  # t_{0.975, 2} = 0.95 / sqrt(0.04875)
SEEDS = (1, 2, 3)
ITEMS = [f"syn-{i:04d}" for i in range(8)]
EXPOSED = ITEMS[:4]  # the exposure arms trained on the first four
# (reward on the exposed items, on the others) per seed; clean has one reward on every item.
REWARDS = {
    "clean": [(0.40, 0.40), (0.50, 0.50), (0.45, 0.45)],
    "paired": [(0.60, 0.42), (0.80, 0.50), (0.70, 0.46)],
    "random_matched": [(0.50, 0.40), (0.55, 0.52), (0.50, 0.44)],
    "paired_answer": [(0.90, 0.38), (0.95, 0.47), (0.85, 0.45)],
    "random_answer": [(0.70, 0.41), (0.65, 0.49), (0.80, 0.43)],
}
ARMS = tuple(REWARDS)
GPUS, BUDGET = 4, 6.0


def _evaluation(arm: str, seed: int) -> dict[str, Any]:
    """The details file's evaluation of one run, built by the job's own summarize()."""
    ex, un = REWARDS[arm][seed - 1]
    exposed = EXPOSED if arm != "clean" else []
    rows = [{"item_id": i, "gold": "x", "rewards": [ex if i in exposed else un], "answers": ["y"]} for i in ITEMS]
    return summarize(rows, exposed, planned=len(exposed),
                     how={"decoding": "greedy", "temperature": 0.0, "samples": 1})


def _record(arm: str, seed: int, *, budget: float, loop: float, elapsed: float, reached: bool = True) -> dict:
    exposure = arm != "clean"
    return {
        "arm": arm, "seed": seed,
        "training": {"status": "REAL_ROLLOUT_MASK_AND_ADVANTAGE_VALIDATED",
                     "counts": {"steps": 10 + seed + (0 if arm == "clean" else -1),
                                "actual_exposed": 8 if exposure else 0},
                     "cost": {"backend_generated_tokens": 1000 * seed}},
        "budget": {"status": "BUDGET_AND_EXPOSURE_RECONCILED" if reached else "BUDGET_OR_EXPOSURE_TARGET_NOT_REACHED",
                   "loop_seconds": loop, "budget_seconds": budget, "overshoot_fraction": (loop - budget) / budget,
                   "time_budget_reached": loop >= budget, "exposure_target_reached": reached,
                   "actual_exposed": 8 if exposure else 0, "target_exposed": 8 if exposure else 0},
        "timing": {"elapsed_seconds": elapsed},
    }


Tweak = Callable[[str, int, dict[str, Any]], None]


def build(ledger, name: str = "five", *, version: int = 1, tweak: Tweak | None = None,  # type: ignore[no-untyped-def]
          retry: tuple[str, int] | None = None, fail: tuple[str, int] | None = None,
          arms: tuple[str, ...] = ARMS) -> None:
    """A 5-arm x 3-seed experiment whose runs succeeded with records and outcomes; `tweak(arm, seed,
    params)` changes a run's budget / loop / profile / reached; `retry` gives one run a failed first
    attempt (node failure) before the one that succeeded; `fail` makes one run fail."""
    params = {(a, s): {"budget": BUDGET, "loop": 6.2 + 0.05 * s, "elapsed": 15.0 + s, "profile": "default",
                       "reached": True} for a in arms for s in SEEDS}
    for (a, s), p in params.items():
        if tweak:
            tweak(a, s, p)
    runs = [NewRun(run_key=f"{name}-v{version}-{s}-{a}", arm=a, seed=s, config_hash="h",
                   run_spec={"executor": "local", "profile": params[a, s]["profile"], "gpus": GPUS,
                             "loop_budget_seconds": params[a, s]["budget"], "train": {"eval_size": 0}},
                   estimated_gpu_hours=0.02) for a in arms for s in SEEDS]
    ledger.create_experiment(name=name, version=version, method="ggpo", source="spec", spec_hash=f"{name}{version}",
                             spec={}, gpus=GPUS, actor="t", runs=runs)
    for a in arms:
        for s in SEEDS:
            key, p = f"{name}-v{version}-{s}-{a}", params[a, s]
            n = 1
            if retry == (a, s):
                ledger.begin_attempt(key, executor="local", gpus=GPUS, actor="w", worker="w")
                ledger.mark_submitted(key, 1, job_id=f"{key}-1", actor="w")
                ledger.mark_finished(key, 1, attempt_state="node_fail", run_state=None, actor="w",
                                     reason="NODE_FAIL; infrastructure retry 1/1", gpu_hours_job=0.004)
                ledger.requeue(key, actor="w", reason="infrastructure retry 1/1")
                n = 2
            ledger.begin_attempt(key, executor="local", gpus=GPUS, actor="w", worker="w")
            ledger.mark_submitted(key, n, job_id=f"{key}-{n}", actor="w")
            gh = GPUS * p["elapsed"] / 3600
            if fail == (a, s):
                ledger.mark_finished(key, n, attempt_state="failed", run_state="failed", actor="w", reason="OOM",
                                     gpu_hours_job=gh)
                continue
            ledger.mark_finished(key, n, attempt_state="succeeded", run_state="succeeded", actor="w",
                                 gpu_hours_job=gh, gpu_hours_scheduler=gh,
                                 result=_record(a, s, budget=p["budget"], loop=p["loop"], elapsed=p["elapsed"],
                                                reached=p["reached"]),
                                 outcome=outcome_from_evaluation(_evaluation(a, s)))


def _kinds(rep: dict) -> set[tuple[str, tuple[str, ...]]]:
    return {(w["kind"], tuple(w["arms"])) for w in rep["warnings"]}


def test_fair_experiment_outcomes_intervals_and_paired_differences(ledger) -> None:  # type: ignore[no-untyped-def]
    build(ledger)
    rep = experiment_report(ledger, "five")
    assert rep["warnings"] == [] and rep["notes"] == []
    for arm in ARMS:
        a = rep["arms"][arm]
        assert a["outcome_runs"] == 3 and a["decoding"] == ["greedy"] and a["eval_items"]["mean"] == 8
        for m in ("eval_reward", "unexposed_reward"):
            st = a["outcome"][m]
            assert st["n"] == 3 and st["ci95_method"] == "t"
            assert st["ci95"][0] <= st["mean"] <= st["ci95"][1]
    assert rep["arms"]["clean"]["outcome"]["exposed_reward"]["n"] == 0  # clean trained on no held-out item
    # paired, by hand: eval reward per seed = (4 exposed + 4 unexposed) / 8 = 0.51, 0.65, 0.58:
    # mean 0.58, s 0.07, 95 % CI 0.58 -+ 4.3027 x 0.07 / sqrt(3) = 0.58 -+ 0.17389
    st = rep["arms"]["paired"]["outcome"]["eval_reward"]
    assert st["mean"] == pytest.approx(0.58) and st["std"] == pytest.approx(0.07)
    assert st["ci95"] == pytest.approx([0.58 - T2 * 0.07 / math.sqrt(3), 0.58 + T2 * 0.07 / math.sqrt(3)])
    assert st["ci95"][0] == pytest.approx(0.406111, abs=1e-6)
    # paired - clean on the items paired trained on: 0.60-0.40, 0.80-0.50, 0.70-0.45 = 0.20, 0.30, 0.25
    d = rep["paired_vs_baseline"]["paired"]
    assert d["exposed_reward"]["per_seed"] == pytest.approx({"1": 0.2, "2": 0.3, "3": 0.25})
    assert d["exposed_reward"]["items_matched"] is True
    assert d["exposed_reward"]["ci95"] == pytest.approx([0.25 - 0.1242069, 0.25 + 0.1242069], abs=1e-7)
    # ... and on the others: 0.02, 0.00, 0.01 -> 0.01 -+ 4.3027 x 0.01 / sqrt(3)
    assert d["unexposed_reward"]["mean"] == pytest.approx(0.01)
    assert d["unexposed_reward"]["ci95"] == pytest.approx([0.01 - 0.0248414, 0.01 + 0.0248414], abs=1e-7)
    assert d["eval_reward"]["mean"] == pytest.approx(0.58 - 0.45)
    for arm in ARMS[1:]:
        for m in ("eval_reward", "exposed_reward", "unexposed_reward"):
            x = rep["paired_vs_baseline"][arm][m]
            assert x["n"] == 3 and x["ci95"][0] <= x["mean"] <= x["ci95"][1]
    # outcome per GPU-hour: each run's eval reward / its GPU-h (4 GPUs x (15 + seed) s / 3600)
    per = rep["arms"]["clean"]["outcome_per_gpu_hour"]["eval_reward"]
    assert per["mean"] == pytest.approx(sum(r / (4 * (15 + s) / 3600) for s, r in zip(SEEDS, (0.4, 0.5, 0.45))) / 3)
    # steps and loop time reached are reported beside the outcomes
    assert rep["arms"]["clean"]["steps"]["mean"] == 12 and rep["arms"]["clean"]["loop_seconds"]["n"] == 3


def test_an_unfair_experiment_gets_exactly_the_right_warnings(ledger) -> None:  # type: ignore[no-untyped-def]
    def shorter(arm: str, seed: int, p: dict) -> None:
        if arm == "random_answer":  # half the budget: it stopped at 3.2 s instead of 6.2 s
            p["budget"], p["loop"] = 3.0, 3.1 + 0.05 * seed

    build(ledger, tweak=shorter, retry=("paired_answer", 2))
    rep = experiment_report(ledger, "five")
    assert _kinds(rep) == {("budget_differs", ("random_answer",)), ("loop_time_differs", ("random_answer",)),
                           ("retried", ("paired_answer",))}
    text = {w["kind"]: w["message"] for w in rep["warnings"]}
    assert "3 s" in text["budget_differs"] and "6 s" in text["budget_differs"]
    assert "seed 2: 2 attempts (node_fail, succeeded)" in text["retried"]


def test_other_warnings(ledger) -> None:  # type: ignore[no-untyped-def]
    def odd(arm: str, seed: int, p: dict) -> None:
        if arm == "paired" and seed == 1:
            p["profile"] = "a100-big"
        if arm == "random_matched" and seed == 3:
            p["reached"] = False
        if arm == "paired_answer":
            p["loop"] = 7.0 + 0.01 * seed  # 16.7 % over the budget: mean overshoot 14 points above clean's

    build(ledger, tweak=odd, fail=("random_answer", 2))
    rep = experiment_report(ledger, "five")
    assert _kinds(rep) == {("resources_differ", ("paired",)), ("exposure_target_not_reached", ("random_matched",)),
                           ("loop_time_differs", ("paired_answer",)), ("overshoot_differs", ("paired_answer",)),
                           ("seeds_missing", ("random_answer",))}
    assert "2 (failed)" in next(w["message"] for w in rep["warnings"] if w["kind"] == "seeds_missing")
    assert rep["paired_vs_baseline"]["random_answer"]["eval_reward"]["n"] == 2
    none = experiment_report(ledger, "five", baseline="nope")
    assert ("no_baseline", ()) in _kinds(none) and none["paired_vs_baseline"] == {}


def test_runs_without_outcomes_and_audit_failures(ledger) -> None:  # type: ignore[no-untyped-def]
    runs = [NewRun(run_key=f"o-v1-{s}-{a}", arm=a, seed=s, config_hash="h", run_spec={"gpus": 4}) for s in (1, 2)
            for a in ("clean", "paired")]
    ledger.create_experiment(name="o", version=1, method="ggpo", source="spec", spec_hash="o", spec={}, gpus=4,
                             actor="t", runs=runs)
    for r in runs:
        ledger.begin_attempt(r.run_key, executor="debug", gpus=4, actor="w", worker="w")
        ledger.mark_submitted(r.run_key, 1, job_id=r.run_key, actor="w")
        rec = _record(r.arm, r.seed, budget=6, loop=6.2, elapsed=15)
        if r.run_key == "o-v1-2-paired":
            rec["training"]["status"] = "ROLLOUT_AUDIT_FAILED"
        ledger.mark_finished(r.run_key, 1, attempt_state="succeeded", run_state="succeeded", actor="w",
                             gpu_hours_job=0.01, result=rec)  # no outcome: a job older than the evaluation
    rep = experiment_report(ledger, "o")
    assert rep["arms"]["paired"]["outcome"]["eval_reward"] == {"mean": None, "std": None, "n": 0, "ci95": None,
                                                               "ci95_method": None}
    assert "no evaluation outcome" in rep["notes"][0]
    assert _kinds(rep) == {("audit_failed", ("paired",)), ("seeds_missing", ("paired",))}
    assert "eval_reward" not in rep["paired_vs_baseline"]["paired"]


@pytest.mark.slow
def test_plots_of_outcomes_and_paired_differences(ledger, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from matplotlib.image import imread

    build(ledger)
    paths = write_plots(experiment_report(ledger, "five"), tmp_path)
    assert [p.name for p in paths] == ["gpu_hours_per_arm.png", "steps_per_arm.png", "outcome_per_arm.png",
                                       "paired_differences.png"]
    for p in paths:
        img = imread(p)
        assert img.shape[0] >= 400 and img.shape[1] >= 900 and float(img[..., :3].std()) > 0.05


def _cli(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_cli_json_text_compare_and_files(env: dict[str, str], tmp_path: Path) -> None:
    from ggpo_batch.ledger import connect

    assert _cli("db", "upgrade").exit_code == 0
    led = connect(env["GGPO_DB_URL"])
    build(led)

    def better(arm: str, seed: int, p: dict) -> None:
        p["loop"] += 0.01

    build(led, version=2, tweak=better)
    led.engine.dispose()
    res = _cli("report", "five", "--version", "1", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["warnings"] == [] and data["arms"]["paired"]["outcome"]["eval_reward"]["ci95"][0] < 0.58
    text = _cli("report", "five")
    assert text.exit_code == 0 and "no comparability warnings" in text.output and "Δ reward" in text.output
    cmp = _cli("report", "five@1", "five@2", "--json")
    assert cmp.exit_code == 0, cmp.output
    c = json.loads(cmp.output)
    assert c["compare"] == ["five v1", "five v2"]
    w = c["arms"]["paired"]["eval_reward"]["b_minus_a"]
    assert w["mean"] == pytest.approx(0.0, abs=1e-12) and w["ci95_method"] == "welch_t"
    assert c["arms"]["clean"]["loop_seconds"]["b_minus_a"]["mean"] == pytest.approx(0.01)
    assert "exposed_reward" in c["paired_vs_baseline"]["paired"]
    assert _cli("report", "five@1", "five@2").exit_code == 0
    assert _cli("report", "five@9").exit_code == 2
    for fmt in ("md", "html"):
        out = tmp_path / f"r.{fmt}"
        res = _cli("report", "five", "--format", fmt, "-o", str(out))
        assert res.exit_code == 0, res.output
        body = out.read_text()
        arm = "paired\\_answer" if fmt == "md" else "paired_answer"  # Markdown: `_` escaped, rendered as is
        assert body.count("data:image/png;base64,") == 4 and arm in body and "95 %" in body
        png = body.split("data:image/png;base64,")[1].split(")" if fmt == "md" else '"')[0]
        assert base64.b64decode(png)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table" in (tmp_path / "r.html").read_text() and "| arm |" in (tmp_path / "r.md").read_text()


SPEC = """
schema = 1
[experiment]
name = "evalpath"
method = "ggpo"
seeds = [1]
gpus = 1
loop_budget_seconds = 1
executor = "debug"
[train]
eval_size = 8
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 2
templates = ["train_direct", "train_role"]
"""


@pytest.mark.redis
@pytest.mark.train
@pytest.mark.slow
def test_a_real_cpu_run_books_its_evaluation_and_the_report_reads_it(ledger, settings, worker_env,  # type: ignore[no-untyped-def]
                                                                      tmp_path: Path, db_url: str) -> None:
    """evaluation (train/evaluation.py) -> details file -> settlement -> runs.outcome -> report: two
    real 1-second CPU runs (clean and paired, seed 1) through the queue and a worker."""
    import os
    import subprocess
    import sys

    from ggpo_batch.contracts.allocation import attempt_folder, details_path
    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.spec.parse import load_spec
    from tests.support.workers import attempt_logs

    if not db_url.startswith("sqlite"):
        pytest.skip("the path is backend-neutral; the outcome column is tested on both backends above")
    spec = tmp_path / "evalpath.toml"
    spec.write_text(SPEC)
    enqueue_spec(ledger, settings, load_spec(spec), actor="tester")
    done = subprocess.run([sys.executable, "-m", "ggpo_batch.cli", "worker", "--queue", "testq", "--burst",
                           "--reconcile-interval", "5"], env=dict(os.environ), capture_output=True, timeout=400,
                          start_new_session=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    rep = experiment_report(ledger, "evalpath")
    for arm in ("clean", "paired"):
        run = ledger.get_run(f"evalpath-v1-1-{arm}")
        assert run.state == "succeeded", (run.cause, done.stderr.decode()[-4000:],
                                          attempt_logs(attempt_folder(settings.jobs_dir, run.run_key, 1)))
        details = json.loads(details_path(attempt_folder(settings.jobs_dir, run.run_key, 1)).read_text())
        ev = details["evaluation"]
        assert ev["decoding"] == "greedy" and ev["items"] == 8 and len(ev["per_item"]) == 8
        assert all({"item_id", "exposed", "reward", "answer", "gold"} <= set(row) for row in ev["per_item"])
        assert {r["item_id"] for r in ev["per_item"] if r["exposed"]} <= set(ev["trained_exposure_item_ids"])
        booked = ledger.outcomes(run.experiment_id).get(run.id)
        assert booked == outcome_from_evaluation(ev)  # the ledger holds what the details say
        st = rep["arms"][arm]["outcome"]["eval_reward"]
        assert st["n"] == 1 and st["mean"] == pytest.approx(ev["mean_reward"]) and st["ci95"] is None
    assert rep["arms"]["clean"]["outcome"]["exposed_reward"]["n"] == 0
    d = rep["paired_vs_baseline"]["paired"]
    assert d["eval_reward"]["n"] == 1 and d["eval_reward"]["items_matched"] is True
    # 1-second loops are coarse (a step is a sizeable part of the budget) and paired may not reach its
    # exposure target in 1 s: the warnings say exactly that, nothing else.
    kinds = {w["kind"] for w in rep["warnings"]}
    assert kinds <= {"loop_time_differs", "overshoot_differs", "exposure_target_not_reached"}, rep["warnings"]
    reached = ledger.get_run("evalpath-v1-1-paired").result["budget"]["exposure_target_reached"]
    assert ("exposure_target_not_reached" in kinds) == (not reached)
