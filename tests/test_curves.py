"""Learning curves: points read generically from history entries, the curve file a job appends to
(read as untrusted), the per-arm mean and band, and the ledger's booking and reads (with the
attempt's provenance) on SQLite and PostgreSQL. A real run's curve: tests/dashboard/test_curves.py."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from ggpo_batch.contracts.curve import FIGURES, append_points, curve_path, point_of, points_of, read_curve, start_curve
from ggpo_batch.ledger import NewRun
from ggpo_batch.ledger.observations import Observations
from ggpo_batch.reporting.learning_curves import (
    RunCurve,
    arm_curve,
    arm_curves,
    experiment_curves,
)
from ggpo_batch.reporting.status import experiment_status


def _entry(step: int, **extra: Any) -> dict[str, Any]:
    return {"step": step, "loss": 0.5 - step / 100, "loop_seconds": 1.5 * (step + 1), "gradient_norm": 1.0,
            "retained_groups": 4, "branch": "deepspeed_zero2", **extra}


def test_a_point_takes_each_figure_it_finds_and_none_for_the_rest() -> None:
    # Today's trainer: no KL, clip fraction or probe; issue 26's adds them (a nested probe too).
    now = point_of(_entry(3, mean_reward=0.25, tokens_per_second=900))
    assert now is not None and now["step"] == 3 and now["mean_reward"] == 0.25 and now["loss"] == pytest.approx(0.47)
    assert now["kl"] is None and now["clip_fraction"] is None and now["probe_gap"] is None
    later = point_of(_entry(4, kl=0.01, clip_fraction=0.2, logprob_gap_p99=0.3, weight_sync_probe={"gap": 0.004},
                            is_weight_mean=1.01))
    assert later is not None and (later["kl"], later["clip_fraction"], later["probe_gap"]) == (0.01, 0.2, 0.004)
    # Not a figure: NaN, infinity, a bool, text, a list; no step: no point.
    odd = point_of(_entry(5, kl=math.nan, mean_reward=True, clip_fraction="0.2", loss=math.inf,
                          weight_sync_probe=[1, 2]))
    assert odd is not None and {odd[k] for k in ("kl", "mean_reward", "clip_fraction", "loss", "probe_gap")} == {None}
    assert point_of({"loss": 1.0}) is None and point_of({"step": -1}) is None and point_of({"step": True}) is None
    assert set(now) == {"step", *FIGURES}
    # One point per step, in step order, the last entry of a step winning.
    assert [p["step"] for p in points_of([_entry(2), _entry(0), _entry(2, loss=9.0), {"x": 1}])] == [0, 2]
    assert points_of([_entry(2), _entry(2, loss=9.0)])[0]["loss"] == 9.0


def test_the_curve_file_is_started_appended_and_read_as_untrusted(tmp_path: Path) -> None:
    folder = tmp_path / "attempt-2"
    start_curve(folder, [_entry(0), _entry(1)])  # a resumed run brings its earlier steps
    append_points(folder, [point_of(_entry(2)), point_of(_entry(3))])  # type: ignore[list-item]
    assert [p["step"] for p in read_curve(folder)] == [0, 1, 2, 3]
    with open(curve_path(folder), "a") as fh:  # a line being written when the dashboard reads
        fh.write('{"step": 4, "loss": 0.')
    assert [p["step"] for p in read_curve(folder)] == [0, 1, 2, 3]
    with open(curve_path(folder), "a") as fh:
        fh.write('1}\nnot json\n{"step": "x"}\n[1]\n')  # the line completed; then lines that are no point
    assert [p["step"] for p in read_curve(folder)] == [0, 1, 2, 3, 4]
    # Read back, a point is what was written.
    assert read_curve(folder)[:4] == points_of([_entry(0), _entry(1), _entry(2), _entry(3)])
    # A long file is read from its end, from the first whole line.
    big = tmp_path / "big"
    start_curve(big, [_entry(i) for i in range(2000)])
    tail = read_curve(big, max_bytes=10_000)
    assert tail and tail[-1]["step"] == 1999 and 0 < len(tail) < 2000 and tail == points_of(
        [_entry(i) for i in range(2000 - len(tail), 2000)])
    # A start rewrites the file (a requeued job in the same folder starts over).
    start_curve(folder, [])
    assert read_curve(folder) == []
    # Not a regular file, or a link: nothing (and a FIFO does not block).
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(curve_path(fifo))
    assert read_curve(fifo) == []
    link = tmp_path / "link"
    link.mkdir()
    os.symlink(curve_path(big), curve_path(link))
    assert read_curve(link) == []
    assert read_curve(tmp_path / "none") == []


def _curve(arm: str, seed: int, loop: list[float], reward: list[float | None]) -> RunCurve:
    return RunCurve(f"e-{seed}-{arm}", arm, seed, "succeeded", "ledger", list(range(len(loop))), list(loop),
                    {"mean_reward": list(reward), "kl": [None] * len(loop)})


def test_an_arm_curve_is_the_mean_of_its_seeds_with_their_range_as_the_band() -> None:
    a = _curve("clean", 1, [1.0, 2.0, 3.0], [0.0, 0.2, 0.4])
    b = _curve("clean", 2, [1.0, 3.0], [0.2, 0.6])
    c = arm_curve([a, b], "mean_reward", [0.5, 1.0, 2.0, 2.5, 3.0, 3.5])
    # 0.5 and 3.5: no seed covers them; 2.0: b interpolated halfway (0.4); 2.5: a 0.3, b 0.5.
    assert c["loop_seconds"] == [1.0, 2.0, 2.5, 3.0]
    assert c["mean"] == pytest.approx([0.1, 0.3, 0.4, 0.5])
    assert c["low"] == pytest.approx([0.0, 0.2, 0.3, 0.4]) and c["high"] == pytest.approx([0.2, 0.4, 0.5, 0.6])
    assert c["runs"] == [2, 2, 2, 2]
    # Unknown values are left out, not read as 0; an arm whose runs never recorded a metric has no curve.
    gap = _curve("paired", 1, [1.0, 2.0, 3.0], [0.1, None, 0.3])
    every = arm_curves([a, b, gap])
    assert every["paired"]["mean_reward"]["mean"][-1] == pytest.approx(0.3)
    assert every["clean"]["kl"]["mean"] == [] and every["clean"]["mean_reward"]["loop_seconds"][-1] == 3.0
    assert len(every["clean"]["mean_reward"]["loop_seconds"]) <= 100 + 2 * 2
    # A run of one step still counts, at its one point (its first and last are on the arm's grid).
    single = arm_curves([_curve("clean", 1, [2.7], [0.5]), _curve("paired", 1, [1.0, 9.0], [0.1, 0.9])])
    assert single["clean"]["mean_reward"]["loop_seconds"] == [2.7] and single["clean"]["mean_reward"]["mean"] == [0.5]


PROVENANCE = {"version": 1, "code": {"source": "checkout", "commit": "c" * 40},
              "environment": {"python": "3.11.7", "distributions_sha256": "d" * 64},
              "hardware": {"accelerator": "NVIDIA H200", "accelerators": 4}, "spec": {"sha256": "s"}}


def test_settlement_books_the_curve_in_bulk_and_the_provenance_with_the_attempt(ledger) -> None:  # type: ignore[no-untyped-def]
    runs = [NewRun(run_key=f"curvy-v1-{s}-clean", arm="clean", seed=s, config_hash="h", run_spec={"gpus": 1})
            for s in (1, 2)]
    exp = ledger.create_experiment(name="curvy", version=1, method="ggpo", source="spec", spec_hash="x", spec={},
                                   gpus=1, actor="t", runs=runs)
    history = [_entry(i, mean_reward=i / 10) for i in range(250)]
    key = runs[0].run_key
    for number in (1, 2):
        ledger.begin_attempt(key, executor="local", gpus=1, actor="t", worker="w")
        ledger.mark_submitted(key, number, job_id=f"j{number}", actor="t")
        if number == 1:  # stopped at its time limit: the curve of the steps it ran, from its curve file
            ledger.mark_finished(key, 1, attempt_state="timeout", run_state="queued", actor="t",
                                 observations=Observations({**PROVENANCE, "hardware": {"accelerator": "A100"}},
                                                           ["torch==2.13.0"], points_of(history[:100])))
        else:  # the continuation's details hold the whole history
            ledger.mark_finished(key, 2, attempt_state="succeeded", run_state="succeeded", actor="t",
                                 observations=Observations(PROVENANCE, ["torch==2.13.0", "numpy==2.1.0"],
                                                           points_of(history)))
    curves = ledger.curves(exp.id)
    assert list(curves) == [ledger.get_run(key).id]
    columns = curves[ledger.get_run(key).id]
    assert columns["step"] == list(range(250))
    assert {f: columns[f] for f in FIGURES} == {f: [p[f] for p in points_of(history)] for f in FIGURES}
    assert ledger.curves(exp.id, ("mean_reward",))[ledger.get_run(key).id]["mean_reward"][-1] == pytest.approx(24.9)
    with pytest.raises(ValueError, match="not curve figures"):
        ledger.curves(exp.id, ("step; DROP TABLE runs",))
    run = ledger.get_run(key)
    attempt_ids = [a.id for a in run.attempts]
    assert ledger.latest_provenance([run.id]) == {run.id: (attempt_ids[1], PROVENANCE)}
    assert ledger.attempt_provenance(attempt_ids)[attempt_ids[0]]["hardware"] == {"accelerator": "A100"}
    assert ledger.distributions(attempt_ids)[attempt_ids[1]] == ["torch==2.13.0", "numpy==2.1.0"]
    # status lists each run with its latest provenance (None for a run that has none).
    [status] = experiment_status(ledger, experiment="curvy", attention=False)
    rows = {r["run_key"]: r for r in status["runs"]}
    assert rows[key]["provenance"] == PROVENANCE and rows[runs[1].run_key]["provenance"] is None
    # The report's curves: the succeeded run's, from the ledger.
    drawn = experiment_curves(ledger, "curvy")
    assert [r["run_key"] for r in drawn["runs"]] == [key] and drawn["runs"][0]["points"] == 250
    assert drawn["arms"]["clean"]["mean_reward"]["mean"][-1] == pytest.approx(24.9)
    json.dumps(drawn)  # plain data


def test_curves_near_the_float_limit_aggregate_and_draw_without_overflow() -> None:
    """A live run's curve.jsonl may hold finite figures near the limit (+-1e308): the mean, band and
    panels stay finite and the API body is strict JSON (was: OverflowError, a 500, and Infinity/NaN)."""
    import json
    import math

    from ggpo_batch.dashboard.charts import curve_panels
    from ggpo_batch.reporting.learning_curves import arm_curves

    runs = [_curve("clean", 1, [1.0, 2.0, 3.0], [1e308, -1e308, 1.7e308]),
            _curve("clean", 2, [1.0, 3.0], [1.7e308, -1.7e308])]
    arms = arm_curves(runs)
    c = arms["clean"]["mean_reward"]
    assert c["mean"] and all(math.isfinite(v) for k in ("mean", "low", "high") for v in c[k]), c
    json.dumps(arms, allow_nan=False)  # strict JSON
    panels = curve_panels({"arms": arms, "metrics": ["mean_reward"], "runs": []})
    text = json.dumps(panels, allow_nan=False)
    assert "nan" not in text.lower() and "inf" not in text.lower()


def test_the_dashboards_json_is_strict_whatever_it_is_given() -> None:
    """Every API body goes through one serializer: a non-finite figure becomes null, never Infinity/NaN."""
    import json

    from ggpo_batch.dashboard.routes import _json_text

    text = _json_text({"mean": [1.0, float("inf"), float("nan")], "nested": ({"x": -float("inf")},)})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}")) == {
        "mean": [1.0, None, None], "nested": [{"x": None}]}
