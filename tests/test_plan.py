"""`plan`, `advise`, the `[power]` table and the report's power block, end to end through the CLI on
a real ledger (SQLite and PostgreSQL) holding the seed record (5 arms x 3 seeds; it has no reward,
so the record metric `steps` stands in, as in docs/researcher.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.ledger import NewRun, connect
from ggpo_batch.reporting import power as pw
from ggpo_batch.reporting.report import experiment_report
from tests.support.paths import JOBS, SEED_000

SPEC = JOBS / "exposure-5arm.toml"
STEPS_SIGMA = 3.7081  # pooled sd of arm - clean steps over the record's 4 comparisons (8 df)


def _run(*args: str, code: int = 0) -> Any:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == code, (args, res.output)
    return res


def _seed_record(env: dict[str, str]) -> None:
    _run("db", "upgrade")
    _run("ledger", "import", str(SEED_000), "--name", "exposure-5arm")


def _counts(env: dict[str, str]) -> tuple[int, int]:
    led = connect(env["GGPO_DB_URL"])
    try:
        return len(led.experiments()), len(led.events())
    finally:
        led.engine.dispose()


def test_plan_prices_the_seeds_from_the_ledgers_sigma_and_writes_nothing(env: dict[str, str]) -> None:
    _seed_record(env)
    before = _counts(env)
    doc = json.loads(_run("plan", str(SPEC), "--metric", "steps", "--effect", "5", "--json").output)
    assert _counts(env) == before
    assert doc["schema"] == 1 and doc["baseline"] == "clean" and doc["arms_compared"] == 4
    assert doc["alpha_per_arm"] == pytest.approx(0.0125) and doc["power"] == 0.8 and doc["effect"] == 5
    assert doc["sigma"]["value"] == pytest.approx(STEPS_SIGMA, abs=1e-4) and doc["sigma"]["df"] == 8
    assert doc["sigma"]["experiments"] == ["exposure-5arm v1 (4 comparisons, 8 df)"]
    assert set(doc["arms"]) == {"paired", "paired_answer", "random_answer", "random_matched"}
    need = pw.seeds_needed(5 / doc["sigma"]["value"], 0.8, 0.0125)
    robust = pw.seeds_robust(5, doc["sigma"]["value"], 8, 0.8, 0.0125)
    assert (need, robust) == (10, 14)
    for row in doc["arms"].values():
        assert (row["seeds"], row["seeds_robust"]) == (need, robust)
        assert row["gpu_hours"] == pytest.approx(need * row["gpu_hours_per_run"])
        assert row["mde_at_spec_seeds"] == pytest.approx(pw.mde(3, 0.8, 0.0125) * STEPS_SIGMA, rel=1e-4)
    per_seed = sum(r["gpu_hours_per_run"] for r in doc["arms"].values()) + doc["baseline_row"]["gpu_hours_per_run"]
    assert doc["total"]["gpu_hours"] == pytest.approx(10 * per_seed)
    assert doc["total"]["within_caps"] is False and doc["total"]["max_gpu_hours"] == 64.0
    assert doc["mde_at_spec_seeds"]["value"] == pytest.approx(24.27, abs=0.01)  # 6.55 sd x 3.71
    text = _run("plan", str(SPEC), "--metric", "steps", "--effect", "5").output
    assert "pooled from exposure-5arm v1 (4 comparisons, 8 df)" in text and "OVER A CAP" in text
    # a given sigma: the same plug-in count, and no uncertainty to plan around
    given = json.loads(_run("plan", str(SPEC), "--metric", "steps", "--effect", "5", "--sigma", "3.7081",
                            "--json").output)
    assert given["arms"]["paired"]["seeds"] == 10 and given["arms"]["paired"]["seeds_robust"] == 10


def test_plan_without_history_says_what_to_give(env: dict[str, str]) -> None:
    _run("db", "upgrade")
    res = _run("plan", str(SPEC), "--effect", "0.02", code=2)
    assert res.output.count("\n") == 1 and "power.sigma" in res.output and "--sigma NUMBER" in res.output
    # without an effect in units the seeds' reach is still shown, in sds
    doc = json.loads(_run("plan", str(SPEC), "--json").output)
    assert doc["mde_at_spec_seeds"]["sd"] == pytest.approx(6.546, abs=1e-3) and doc["total"]["seeds"] is None
    assert json.loads(_run("plan", str(SPEC), "--effect-sd", "1", "--json").output)["arms"]["paired"]["seeds"] == \
        pw.seeds_needed(1.0, 0.8, 0.0125)


def test_advise_on_the_seed_record(env: dict[str, str]) -> None:
    _seed_record(env)
    doc = json.loads(_run("advise", "exposure-5arm", "--metric", "steps", "--max-gpu-hours", "64", "--json").output)
    arms = doc["arms"]
    assert doc["schema"] == 1 and doc["remaining_gpu_hours"] == pytest.approx(64 - 57.2974, abs=1e-3)
    pa = arms["paired_answer"]
    assert pa["mean"] == pytest.approx(-7.667, abs=1e-3) and pa["p_adjusted"] == pytest.approx(0.136, abs=1e-3)
    assert pa["ci95"] == [pytest.approx(-13.92, abs=0.01), pytest.approx(-1.415, abs=0.01)]
    assert pa["per_seed"] == {"20261012": -10, "20261013": -8, "20261014": -5}
    assert pa["verdict"] == "not_worth_it" and "left under the cap" in pa["reason"] and "decide" in pa["reason"]
    assert arms["paired"]["verdict"] == "not_worth_it" and "mean difference of 0" in arms["paired"]["reason"]
    assert arms["random_matched"]["verdict"] == "not_worth_it" and "max_seeds 10" in arms["random_matched"]["reason"]
    # a budget that holds them: add the seeds, priced at the measured GPU-h per run of the arm and clean
    doc = json.loads(_run("advise", "exposure-5arm", "--metric", "steps", "--json").output)
    pa = doc["arms"]["paired_answer"]
    assert pa["verdict"] == "add" and pa["add_seeds"] == pa["seeds_needed"] - 3 == 3
    assert pa["add_gpu_hours"] == pytest.approx(3 * (3.7907 + 3.7790), abs=0.01)
    assert 0.5 < pa["predictive_success"] < 1 and "combination test" in pa["reason"]
    stop = json.loads(_run("advise", "exposure-5arm@1", "--metric", "backend_calls", "--json").output)
    assert stop["arms"]["random_answer"]["verdict"] == "stop"
    assert stop["arms"]["random_answer"]["reason"].startswith("detected, worse")  # fewer calls; direction "higher"
    text = _run("advise", "exposure-5arm", "--metric", "steps").output
    assert "holm over 4 arms (planned at 0.0125)" in text and "paired_answer" in text
    res = _run("advise", "exposure-5arm", code=2)  # the record has no reward: said, in one line
    assert res.output.count("\n") == 1 and "--metric steps" in res.output


def _experiment(ledger: Any, name: str, power: dict[str, Any] | None, rewards: dict[tuple[str, int], float]) -> None:
    """An experiment of succeeded runs with these eval rewards and this [power] table in its spec."""
    runs = [NewRun(run_key=f"{name}-v1-{s}-{a}", arm=a, seed=s, config_hash="h", run_spec={"gpus": 1})
            for a, s in rewards]
    ledger.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=name,
                             spec={"power": power} if power else {}, gpus=1, actor="t", runs=runs)
    for r in runs:
        ledger.begin_attempt(r.run_key, executor="local", gpus=1, actor="w", worker="w")
        ledger.mark_submitted(r.run_key, 1, job_id="j", actor="w")
        reward = rewards[(r.arm, r.seed)]
        ledger.mark_finished(r.run_key, 1, attempt_state="succeeded", run_state="succeeded", actor="w",
                             gpu_hours_job=0.5, result={"arm": r.arm, "seed": r.seed},
                             outcome={"eval_reward": reward, "exposed_reward": reward, "unexposed_reward": reward,
                                      "items": 2, "exposed_items": 1, "decoding": "greedy", "temperature": 0.0,
                                      "samples": 1})


REWARDS = {("clean", 1): 0.50, ("clean", 2): 0.40, ("clean", 3): 0.45,
           ("paired", 1): 0.55, ("paired", 2): 0.52, ("paired", 3): 0.47}  # differences 0.05, 0.12, 0.02


def test_the_reports_power_block_and_underpowered_warning(ledger: Any, env: dict[str, str]) -> None:
    _experiment(ledger, "declared", {"metric": "eval_reward", "effect": 0.05}, REWARDS)
    _experiment(ledger, "undeclared", None, REWARDS)
    rep = experiment_report(ledger, "declared")
    block = rep["power"]
    sd = math.sqrt(((0.05 - 19 / 300) ** 2 + (0.12 - 19 / 300) ** 2 + (0.02 - 19 / 300) ** 2) / 2)
    assert block["sigma"]["value"] == pytest.approx(sd) and block["sigma"]["df"] == 2 and block["alpha_per_arm"] == 0.05
    row = block["arms"]["paired"]
    assert row["mde"] == pytest.approx(pw.mde(3, 0.8, 0.05) * sd)
    errors = pw.design_errors(0.05 / sd, 3, 0.05)
    assert row["power_at_effect"] == pytest.approx(errors.power) and row["type_m"] == pytest.approx(errors.type_m)
    assert row["type_m"] > 1.4 and row["power_at_effect"] < 0.8
    [warn] = [w for w in rep["warnings"] if w["kind"] == "underpowered"]
    assert warn["arms"] == ["paired"] and "declared effect 0.05" in warn["message"]
    text = _run("report", "declared").output
    assert "underpowered: paired: 3 seeds had power" in text and "no comparability warnings" in text
    assert "power (eval_reward, alpha 0.05 -> 0.05 per arm, 80%)" in text and "type M" in text
    plain = experiment_report(ledger, "undeclared")
    assert plain["power"]["arms"]["paired"]["mde"] == pytest.approx(row["mde"]) and plain["power"]["effect"] is None
    assert not [w for w in plain["warnings"] if w["kind"] == "underpowered"]  # no [power]: no new warning


POWER_SPEC = """
schema = 1
[experiment]
name = "pw"
method = "ggpo"
seeds = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
loop_budget_seconds = 5
executor = "debug"
[arms.clean]
[arms.paired]
exposure = "paired"
exposed_items = 3
templates = ["train_direct", "train_role"]
[power]
metric = "eval_reward"
sigma = 0.1
{extra}
"""


@pytest.mark.parametrize("extra, field", [
    ('effect = 0.02\neffect_sd = 1.0', "power.effect_sd"),
    ('effect = -1', "power.effect"),
    ('design = "sequential"\nwaves = [5, 3]', "power.waves"),
    ('design = "sequential"', "power.waves"),
    ('design = "sequential"\nwaves = [3, 11]', "power.waves"),
    ('waves = [3, 5]', "power.waves"),
    ('metric = "bogus"', "power.metric"),
    ('sigma = "pilot"', "power.sigma"),
    ('alpha = 0.7', "power.alpha"),
    ('spending = "haybittle"', "power.spending"),
    ('colour = "red"', "power.colour"),
])
def test_every_bad_power_value_is_one_line_naming_the_field(env: dict[str, str], tmp_path: Path, extra: str,
                                                            field: str) -> None:
    _run("db", "upgrade")
    spec = tmp_path / "pw.toml"
    body = POWER_SPEC.format(extra=extra)
    if extra.startswith(("metric", "sigma")):
        body = body.replace('metric = "eval_reward"\n', "").replace("sigma = 0.1\n", "")
    spec.write_text(body)
    res = _run("plan", str(spec), code=2)
    assert res.output.count("\n") == 1 and f": {field}" in res.output, res.output


def test_a_sequential_design_is_planned_with_its_boundaries_and_its_later_waves_held(env: dict[str, str],
                                                                                     tmp_path: Path) -> None:
    _run("db", "upgrade")
    spec = tmp_path / "pw.toml"
    spec.write_text(POWER_SPEC.format(extra='effect = 0.135\ndesign = "sequential"\nwaves = [3, 5, 7, 10]'))
    doc = json.loads(_run("plan", str(spec), "--json").output)
    d = doc["design"]
    assert d["kind"] == "sequential" and d["waves"] == [3, 5, 7, 10]
    assert d["boundaries"][1:] == [pytest.approx(5.50, rel=0.02), pytest.approx(3.35, rel=0.02),
                                   pytest.approx(2.43, rel=0.01)]
    assert d["false_positive_rate"] == pytest.approx(0.05, abs=0.004) and 0.9 < d["power"] < 0.99
    assert d["expected_seeds"] < 10 and "sequential [3, 5, 7, 10]" in _run("plan", str(spec)).output
    out = _run("enqueue", str(spec), "--dry-run").output  # the first wave queued, the 7 later seeds x 2 arms held
    assert "sequential design, waves [3, 5, 7, 10]: 14 run(s) of the later waves would be held" in out


def test_enqueue_dry_run_says_what_the_seeds_detect(env: dict[str, str], tmp_path: Path) -> None:
    _run("db", "upgrade")
    spec = tmp_path / "pw.toml"
    spec.write_text(POWER_SPEC.format(extra="effect = 0.05"))
    out = _run("enqueue", str(spec), "--dry-run").output
    need = pw.seeds_needed(0.5, 0.8, 0.05)
    assert (f"power: 10 seeds detect |difference| >= {pw.mde(10, 0.8, 0.05) * 0.1:.4g} eval_reward (80%, alpha 0.05 "
            f"per arm); the [power] effect needs {need} seeds") in out
    spec.write_text(POWER_SPEC.format(extra="effect = 0.05").replace("sigma = 0.1\n", ""))
    out = _run("enqueue", str(spec), "--dry-run").output  # no history: said, and the dry run goes on
    assert "power: no earlier runs of ggpo with eval_reward" in out and "dry run: nothing written" in out


def test_the_power_table_is_in_the_hash_only_when_present(tmp_path: Path) -> None:
    from ggpo_batch.spec.parse import load_spec

    with_table, without = tmp_path / "a.toml", tmp_path / "b.toml"
    with_table.write_text(POWER_SPEC.format(extra="effect = 0.02"))
    without.write_text(POWER_SPEC.format(extra="").split("[power]")[0])
    a, b = load_spec(with_table), load_spec(without)
    assert "power" in a.canonical() and "power" not in b.canonical() and a.spec_hash != b.spec_hash


def test_advise_verdicts_on_edge_cases(ledger: Any) -> None:
    from ggpo_batch.reporting.advice import advise

    same = {(a, s): (0.5 if a == "clean" else 0.55) for a in ("clean", "paired") for s in (1, 2, 3)}
    _experiment(ledger, "constant", None, same)  # every seed differs by 0.05: sd 0, no division by zero
    row = advise(ledger, "constant")["arms"]["paired"]
    assert row["verdict"] == "stop" and row["p"] == 0.0 and row["mde"] is None
    # the seeds a large declared effect needs have run, and it was not detected: stop, not "add"
    _experiment(ledger, "powered", {"effect": 1.0, "sigma": 0.1}, REWARDS)
    row = advise(ledger, "powered")["arms"]["paired"]
    assert row["verdict"] == "stop" and row["seeds_needed"] <= 3 and "did not detect" in row["reason"]
    # the same data planned for a small effect: more seeds than max_seeds
    row = advise(ledger, "powered", max_seeds=5, sigma=1.0)["arms"]["paired"]
    assert row["verdict"] == "not_worth_it" and "max_seeds 5" in row["reason"]


def test_sigma_is_pooled_over_the_method_or_the_experiments_named(ledger: Any) -> None:
    from ggpo_batch.errors import LedgerError
    from ggpo_batch.reporting.variance import ledger_sigma

    _experiment(ledger, "one", None, REWARDS)
    doubled = {k: v * 2 for k, v in REWARDS.items()}
    _experiment(ledger, "two", None, doubled)
    both = ledger_sigma(ledger, method="ggpo", metric="eval_reward")
    one = ledger_sigma(ledger, method="ggpo", metric="eval_reward", only=[("one", None)])
    assert both.df == 4 and one.df == 2 and both.value == pytest.approx(one.value * math.sqrt(5 / 2))
    assert one.experiments == ("one v1 (1 comparison, 2 df)",)
    assert ledger_sigma(ledger, method="other", metric="eval_reward") is None
    assert ledger_sigma(ledger, method="ggpo", metric="steps") is None
    with pytest.raises(LedgerError, match="no such version"):
        ledger_sigma(ledger, method="ggpo", metric="eval_reward", only=[("one", 3)])


def test_advise_and_report_follow_a_sequential_design(ledger: Any) -> None:
    from ggpo_batch.reporting.advice import advise

    design = {"metric": "eval_reward", "effect": 0.05, "design": "sequential", "waves": [3, 5]}
    _experiment(ledger, "waves", design, REWARDS)  # the first wave's 3 seeds ran
    row = advise(ledger, "waves")["arms"]["paired"]
    assert row["look"]["look"] == 1 and row["look"]["next_wave"] == 5 and not row["look"]["crossed"]
    assert row["verdict"] == "add" and row["add_seeds"] == 2 and "as the design planned" in row["reason"]
    assert "combination test" not in row["reason"]  # a planned wave needs none
    block = experiment_report(ledger, "waves")["power"]["arms"]["paired"]
    assert block["look"]["look"] == 1 and block["look"]["looks"] == 2
    clear = {**REWARDS, ("paired", 1): 0.60, ("paired", 2): 0.50, ("paired", 3): 0.55}  # +0.10 each seed: sd 0
    _experiment(ledger, "crossed", {**design, "waves": [2, 3]}, clear)
    row = advise(ledger, "crossed")["arms"]["paired"]
    assert row["verdict"] == "stop" and row["reason"].endswith("detected, better") and row["look"]["look"] == 2
