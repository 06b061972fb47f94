"""Every machine-readable document carries its schema number, and its shape changes only with it.

One ledger holds what every document can show (an imported experiment of 15 succeeded runs, a
spec's runs queued on Redis, a failed one, a running one with a heartbeat, one with a log, one
booked with its provenance and learning curve, a decision, a nightly component record); each
`--json` command and dashboard API prints its document over it, on SQLite and on PostgreSQL. The
shape of each (its field paths, `ggpo_batch.common.schemas.key_paths`) must equal the shape recorded for
its number in tests/data/json_shapes.json. That file is append-only: a number's shape, once
recorded, never changes. A new number's shape is recorded by running this module with GGPO_RECORD_JSON_SHAPES=1;
docs/json.md is generated from the record.

Beside the shapes, the types: tests/data/json_types.json records the JSON types of each field of each
number (`ggpo_batch.common.schema_types`), append-only too (recording types for a number that has none
is not a shape change); a field seen with a type its number does not record fails. Every document is
validated against its published JSON Schema (docs/reference/json/KIND.schema.json, made from that
record by `python tools/docs/reference.py`) with jsonschema.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common import schema_types, schemas
from ggpo_batch.contracts.curve import points_of
from ggpo_batch.contracts.evaluation_spec import evaluation_key
from ggpo_batch.contracts.heartbeat import Heartbeat
from ggpo_batch.contracts.provenance import collect, split_distributions
from ggpo_batch.ledger import NewRun
from ggpo_batch.ledger.observations import Observations
from ggpo_batch.ledger.submissions import AttemptPlan
from tests.dashboard.server import Dashboard, cli_env, get
from tests.support.evaluations import items_file, succeeded_experiment, training_files
from tests.support.paths import DATA, REPO, SEED_000, SEED_003

pytestmark = [pytest.mark.redis, pytest.mark.slow]

SHAPES = DATA / "json_shapes.json"
TYPES = DATA / "json_types.json"
DOC = REPO / "docs" / "json.md"
RECORD = os.environ.get("GGPO_RECORD_JSON_SHAPES") == "1"

SPEC = """
schema = 1
[experiment]
name = "queued-exp"
method = "ggpo"
seeds = [1, 2, 3, 4]
gpus = 4
loop_budget_seconds = 5
executor = "debug"
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 2
templates = ["train_direct", "train_role"]
"""


def _cli(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, (args, res.output)
    return res.output


def _documents(env: dict[str, str], tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch,
               ) -> dict[str, list[Any]]:
    """kind -> the documents of that kind printed over one ledger holding a bit of everything."""
    from ggpo_batch.ledger import connect

    monkeypatch.setenv("GGPO_REDIS_URL", redis_url)
    docs: dict[str, list[Any]] = {}

    def add(kind: str, text: str) -> None:
        docs.setdefault(kind, []).append(json.loads(text))

    add("db_current", _cli("db", "upgrade") and _cli("db", "current", "--json"))
    add("ledger_import", _cli("ledger", "import", str(SEED_000), "--name", "done-exp", "--json"))
    spec = tmp_path / "queued-exp.toml"
    spec.write_text(SPEC)
    add("enqueue", _cli("enqueue", str(spec), "--dry-run", "--json"))
    add("enqueue", _cli("enqueue", str(spec), "--json"))
    add("decide", _cli("decide", "paper-full", "--not-reproduced", "--reason", "too costly", "--cost-basis",
                       "the paper's setup", "--estimated-gpu-hours", "5000", "--json"))
    led = connect(env["GGPO_DB_URL"])
    keys = [r.run_key for r in led.runs() if r.experiment.name == "queued-exp"]
    failed, running, cancelled = keys[0], keys[1], keys[2]
    led.begin_attempt(failed, executor="debug", gpus=4, actor="t", worker="w")
    led.resolve_submitting(failed, 1, job_id=None, actor="t", reason="refused", state="failed")
    att = led.begin_attempt(running, executor="local", gpus=4, actor="t", worker="w")
    led.mark_submitted(running, 1, job_id="4242", actor="t")
    led.mark_running(running, 1, actor="t")
    led.record_heartbeats([(att.id, Heartbeat(step=3, loop_seconds=2.5, budget_seconds=5.0, mean_reward=0.25,
                                              tokens_per_second=100.0, updated_at=datetime.now(UTC).timestamp()))])
    folder = Path(env["GGPO_DATA_DIR"]) / "jobs" / running / "attempt-1"
    folder.mkdir(parents=True)
    (folder / "4242_0_log.out").write_text("step 3\n")
    (folder / "4242_0_log.err").write_text("")
    # A run booked with its provenance and learning curve (an experiment of its own: the documents
    # about done-exp and queued-exp stay as they were).
    booked = "curved-exp-v1-1-clean"
    led.create_experiment(name="curved-exp", version=1, method="ggpo", source="spec", spec_hash="c", spec={}, gpus=4,
                          actor="t", runs=[NewRun(run_key=booked, arm="clean", seed=1, config_hash="h",
                                                  run_spec={"gpus": 4})])
    led.begin_attempt(booked, executor="local", gpus=4, actor="t", worker="w")
    led.mark_submitted(booked, 1, job_id="4343", actor="t")
    provenance, listed = split_distributions(collect("{}", config_hash="h", cuda=False, world_size=4, nodes=["n1"],
                                                     visible_devices=None, image_digest="sha256:abc"))
    history = [{"step": i, "loop_seconds": 0.5 * (i + 1), "loss": 0.1, "mean_reward": 0.2, "kl": 0.01} for i in range(3)]
    led.mark_finished(booked, 1, attempt_state="succeeded", run_state="succeeded", actor="t",
                      result=next(iter(json.loads(SEED_000.read_text()).values())),
                      observations=Observations(provenance, listed, points_of(history)))
    night = led.claim_night(method="ggpo", tier="l1_mechanism", night="2026-12-01", actor="t")
    led.finish_component_run(night.id, state="succeeded", record=json.loads(SEED_003.read_text()), seconds=12.0,
                             commit="abc", dirty=False)
    led.claim_night(method="ggpo", tier="l1_mechanism", night="2026-12-02", actor="t")
    # evaluations after training: one run evaluated (outcome booked), one whose evaluation is
    # cancelled, one left out (no trained item ids)
    jobs = Path(env["GGPO_DATA_DIR"]) / "jobs"
    evaluated = succeeded_experiment(led, jobs, "evaluated", seeds=(1, 2, 3))
    training_files(jobs, evaluated[2], trained=None)
    led.engine.dispose()
    add("evaluate", _cli("evaluate", "evaluated", "--data", str(items_file(tmp_path / "eval2.jsonl", ["a", "b"])),
                         "--name", "eval2", "--json"))
    led = connect(env["GGPO_DB_URL"])
    done = evaluation_key(evaluated[0], "eval2")
    _ev, att = led.begin_evaluation(done, actor="t", worker="w", plan=lambda spec, q: AttemptPlan("local", 1))
    led.finish_evaluation(done, att.number, attempt_state="succeeded", evaluation_state="succeeded", actor="t",
                          job_id="e1", gpu_hours_job=0.001,
                          outcome={"eval_reward": 0.5, "exposed_reward": 1.0, "unexposed_reward": 0.0, "items": 2,
                                   "exposed_items": 1, "decoding": "greedy", "temperature": 0.0, "samples": 1,
                                   "item_rewards": {"a": 1.0, "b": 0.0}, "exposed_item_ids": ["a"]})
    led.engine.dispose()
    add("cancel", _cli("cancel", evaluated[1], "--evaluation", "eval2", "--json"))
    add("report", _cli("report", "evaluated", "--outcomes", "eval2", "--json"))
    add("cancel", _cli("cancel", cancelled, "--json"))
    add("logs", _cli("logs", running, "--json"))
    add("nightly", _cli("nightly", "--night", "2026-12-02", "--json"))  # claimed already: nothing run
    add("reconcile", _cli("reconcile", "--json"))  # it also records the experiments that finished
    add("config", _cli("config", "--json"))
    _notifications(env, monkeypatch, add)
    add("gc", _cli("gc", "--older-than", "0d", "--dry-run", "--json"))
    for args in ([], ["--runs", "--limit", "0"], ["-s", "failed"]):
        add("status", _cli("status", "--json", *args))
    add("components", _cli("status", "--components", "--json"))
    add("report", _cli("report", "done-exp", "--json"))
    _powered(env)  # an experiment with eval rewards paired by seed and a [power] table: the report's power block
    add("report", _cli("report", "powered-exp", "--json"))
    add("plan", _cli("plan", str(spec), "--sigma", "0.1", "--effect", "0.05", "--json"))
    add("plan", _cli("plan", str(spec), "--metric", "steps", "--json"))  # sigma from the ledger (done-exp)
    sequential = tmp_path / "sequential.toml"
    sequential.write_text(SPEC.replace("seeds = [1, 2, 3, 4]", "seeds = [1, 2, 3, 4, 5]")
                          + '[power]\nsigma = 0.1\neffect = 0.05\ndesign = "sequential"\nwaves = [3, 5]\n')
    add("plan", _cli("plan", str(sequential), "--json"))
    add("advise", _cli("advise", "done-exp", "--metric", "steps", "--max-gpu-hours", "64", "--json"))
    add("advise", _cli("advise", "powered-exp", "--json"))
    _canary(env, tmp_path, add)  # an experiment whose canary ran and passed: `canary`, its report
    add("report", _cli("report", "queued-exp", "--json"))
    add("report_comparison", _cli("report", "done-exp", "queued-exp", "--json"))
    # eval rewards paired by seed, a [power] table and intervals of the difference on both sides
    add("report_comparison", _cli("report", "powered-exp", "done-exp", "--json"))
    add("report_comparison", _cli("report", "done-exp", "powered-exp", "--json"))
    add("report_comparison", _cli("report", "powered-exp", "powered-exp", "--json"))
    add("report_comparison", _cli("report", "done-exp", "done-exp", "--json"))
    add("ledger_export", _cli("ledger", "export", "--format", "json"))
    for by in ("user", "experiment", "queue", "month"):
        add("costs", _cli("costs", "--by", by, "--json"))
    dash = Dashboard(cli_env(**{k: v for k, v in os.environ.items() if k.startswith("GGPO_")}),
                     tmp_path / "dashboard.log")
    try:
        for kind, route in (("status", "/api/status?runs=1&limit=0"), ("components", "/api/components"),
                            ("dashboard_experiment", "/api/experiments/done-exp"),
                            ("dashboard_experiment", "/api/experiments/queued-exp"),
                            ("dashboard_run", f"/api/runs/{running}"), ("dashboard_run", f"/api/runs/{failed}"),
                            ("costs", "/api/costs?by=month&since=2026-01-01"),
                            ("dashboard_run", f"/api/runs/{evaluated[0]}"),
                            ("dashboard_experiment", "/api/experiments/evaluated"),

                            ("dashboard_experiment", "/api/experiments/curved-exp"),
                            ("dashboard_experiment", "/api/experiments/canary-exp"),
                            ("dashboard_experiment", "/api/experiments/powered-exp"),
                            ("dashboard_run", f"/api/runs/{booked}"), ("curves", "/api/experiments/done-exp/curves"),
                            ("curves", "/api/experiments/curved-exp/curves")):
            code, body = get(dash.url + route)
            assert code == 200, (route, body)
            add(kind, body)
    finally:
        dash.stop()
    return docs


def _canary(env: dict[str, str], tmp_path: Path, add: Any) -> None:
    """An experiment held for its canary (enqueue), the canary booked passed with a record (its job,
    train/run/canary.py, is tested in tests/train/test_canary_checks.py), then `canary` and `report`."""
    from ggpo_batch.ledger import connect

    spec = tmp_path / "canary-exp.toml"
    spec.write_text(SPEC.replace('name = "queued-exp"', 'name = "canary-exp"')
                    .replace('executor = "debug"', 'executor = "debug"\ncanary = true'))
    add("enqueue", _cli("enqueue", str(spec), "--json"))
    led = connect(env["GGPO_DB_URL"])
    [c] = led.canaries(led.latest_experiment("canary-exp").id)
    _c, att = led.begin_canary(c.key, actor="t", worker="w", executor="debug", gpus=4)
    record = {"canary_record": 1, "key": c.key, "passed": True, "device": "cpu",
              "checks": [{"name": "sleep_wake_generation", "passed": True, "skipped_sleep_wake": True},
                         {"name": "probe_baseline", "passed": True, "reason": ""}]}
    led.end_canary(c.key, att.number, attempt_state="succeeded", canary_state="passed", reason=None, record=record,
                   actor="t", job_id="c1", elapsed_seconds=36.0, gpu_hours_job=0.04)
    led.engine.dispose()
    add("status", _cli("status", "-e", "canary-exp", "--json"))  # its runs still held: the canaries shown
    add("canary", _cli("canary", "canary-exp", "--json"))
    add("report", _cli("report", "canary-exp", "--json"))


def _powered(env: dict[str, str]) -> None:
    from ggpo_batch.ledger import connect

    led = connect(env["GGPO_DB_URL"])
    runs = [NewRun(run_key=f"powered-exp-v1-{seed}-{arm}", arm=arm, seed=seed, config_hash="h", run_spec={"gpus": 1})
            for arm in ("clean", "paired") for seed in (1, 2, 3)]
    led.create_experiment(name="powered-exp", version=1, method="other", source="spec", spec_hash="p", gpus=1,
                          spec={"power": {"metric": "eval_reward", "effect": 0.05, "design": "sequential", "waves": [2, 3]}}, actor="t", runs=runs)
    for i, r in enumerate(runs):
        led.begin_attempt(r.run_key, executor="local", gpus=1, actor="t", worker="w")
        led.mark_submitted(r.run_key, 1, job_id=f"p{i}", actor="t")
        reward = 0.4 + 0.01 * i * i
        led.mark_finished(r.run_key, 1, attempt_state="succeeded", run_state="succeeded", actor="t",
                          gpu_hours_job=0.5, result={"arm": r.arm, "seed": r.seed},
                          outcome={"eval_reward": reward, "exposed_reward": reward, "unexposed_reward": reward,
                                   "items": 2, "exposed_items": 1, "decoding": "greedy", "temperature": 0.0,
                                   "samples": 1})
    led.engine.dispose()


def _notifications(env: dict[str, str], monkeypatch: pytest.MonkeyPatch, add: Any) -> None:
    """The outbox after one delivery pass to a webhook that refuses connections, as `notifications`
    shows it, and each notification as a webhook would get it."""
    from ggpo_batch.common.netutil import free_port
    from ggpo_batch.config.settings import load_settings
    from ggpo_batch.ledger import connect
    from ggpo_batch.notify.delivery import deliver_due
    from ggpo_batch.notify.senders import payload

    monkeypatch.setenv("GGPO_NOTIFY_WEBHOOK_URLS", f"http://127.0.0.1:{free_port()}/hook")
    monkeypatch.setenv("GGPO_NOTIFY_TIMEOUT_SECONDS", "0.5")
    led = connect(env["GGPO_DB_URL"])
    try:
        deliver_due(led, load_settings().notify)
        outbox = [n for n, _ in led.notifications(undelivered=False)]
        assert {n.kind for n in outbox} >= {"run_failed", "cost_decision"}, outbox
        for n in outbox:
            add("notification", json.dumps(payload(n), default=str))
    finally:
        led.engine.dispose()
    add("notifications", _cli("notifications", "--json"))
    add("notifications", _cli("notifications", "--all", "--json"))


def _first_line_has_schema(text: str, kind: str) -> bool:
    return text.splitlines()[0].startswith(schemas.stream_head(kind) + ",")


def _shape_problems(docs: dict[str, list[Any]], recorded: dict[str, dict[str, list[str]]]) -> list[str]:
    """What is wrong with `docs` against the recorded shapes (with GGPO_RECORD_JSON_SHAPES=1, a number
    not recorded yet is recorded in `recorded` instead)."""
    problems = []
    for kind, documents in docs.items():
        number = schemas.SCHEMAS[kind].number
        problems += [f"{kind}: a document says schema {d.get('schema')}, not {number}" for d in documents
                     if d.get("schema") != number]
        shape = set().union(*(schemas.key_paths(kind, d) for d in documents))
        known = recorded.setdefault(kind, {}).get(str(number))
        if known is None:
            if RECORD:
                recorded[kind][str(number)] = sorted(shape)
                continue
            problems.append(f"{kind}: no shape recorded for schema {number} (record it: GGPO_RECORD_JSON_SHAPES=1)")
        elif set(known) != shape:
            added, removed = sorted(shape - set(known)), sorted(set(known) - shape)
            problems.append(f"{kind}: the shape of schema {number} changed (added {added}, removed {removed}): give "
                            f"it a new number in ggpo_batch/common/schemas.py and record that one")
    return problems


def _recorded() -> dict[str, dict[str, list[str]]]:
    return json.loads(SHAPES.read_text()) if SHAPES.exists() else {}


def _recorded_types() -> dict[str, dict[str, dict[str, list[str]]]]:
    return json.loads(TYPES.read_text()) if TYPES.exists() else {}


def _type_problems(docs: dict[str, list[Any]], recorded: dict[str, dict[str, dict[str, list[str]]]]) -> list[str]:
    """Fields of `docs` seen with a type the record of their number does not hold (with
    GGPO_RECORD_JSON_SHAPES=1, a number without recorded types is recorded in `recorded` instead)."""
    problems = []
    for kind, documents in docs.items():
        number = schemas.SCHEMAS[kind].number
        seen: dict[str, set[str]] = {}
        for d in documents:
            for key, types in schema_types.type_paths(kind, d).items():
                seen.setdefault(key, set()).update(types)
        known = recorded.setdefault(kind, {}).get(str(number))
        if known is None:
            if RECORD:
                recorded[kind][str(number)] = {k: schema_types.normal_types(v) for k, v in sorted(seen.items())}
                continue
            problems.append(f"{kind}: no types recorded for schema {number} (record them: GGPO_RECORD_JSON_SHAPES=1)")
            continue
        for key, types in sorted(seen.items()):
            base = key.split(schema_types.ITEMS)[0]  # the elements of a list whose field had no type yet: none either
            if schema_types.unknown(known.get(key, known.get(base, ["?"]) if base != key else ["?"])):
                if RECORD:  # completing the record: no type seen before changes
                    known[key] = schema_types.normal_types({*known.get(key, ()), *types})
            elif key not in known:
                problems.append(f"{kind}: schema {number} records no type for {key} (seen {sorted(types)})")
            elif not schema_types.admits(known[key], types):
                problems.append(f"{kind}: {key} of schema {number} is {known[key]}, seen {sorted(types)}: a changed "
                                f"type needs a new number in ggpo_batch/common/schemas.py")
    return problems


def _validation_problems(docs: dict[str, list[Any]]) -> list[str]:
    """Each document checked against its published schema (docs/reference/json/KIND.schema.json)."""
    from tests.support.json_contract import problems_of

    return [p for kind, documents in docs.items() for d in documents for p in problems_of(kind, d)]


def test_every_document_has_its_number_and_the_shape_recorded_for_it(env: dict[str, str], tmp_path: Path,
                                                                     redis_url: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _documents(env, tmp_path, redis_url, monkeypatch)
    assert set(docs) == set(schemas.SCHEMAS), "a kind of document is not exercised here"
    recorded, recorded_types = _recorded(), _recorded_types()
    problems = _shape_problems(docs, recorded) + _type_problems(docs, recorded_types)
    if RECORD:
        SHAPES.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
        TYPES.write_text(json.dumps(recorded_types, indent=1, sort_keys=True) + "\n")
        DOC.write_text(schemas.markdown(recorded))
    assert not problems, "\n".join(problems)
    assert _validation_problems(docs) == []
    assert DOC.read_text() == schemas.markdown(recorded), "docs/json.md is stale: GGPO_RECORD_JSON_SHAPES=1 rewrites it"
    # Streamed documents say their number on the first line.
    assert _first_line_has_schema(_cli("status", "--json", "--runs"), "status")
    assert _first_line_has_schema(_cli("ledger", "export", "--format", "json"), "ledger_export")


def test_a_changed_shape_or_number_is_caught() -> None:
    """The check above on planted changes to a recorded status document: a field more in a run row,
    a field less, a wrong number; more data of the same shape (another arm) is no change."""
    n = schemas.SCHEMAS["status"].number
    doc = {"schema": n, "experiments": [{"arms": {"a": {"runs": 1, "states": {"queued": 1}}},
                                         "runs": [{"run_key": "k", "state": "queued"}]}], "decided": []}
    assert "experiments.arms.*.states.*" in schemas.key_paths("status", doc)

    base = schemas.key_paths("status", doc)
    assert _shape_problems({"status": [doc]}, {"status": {str(n): sorted(base)}}) == []
    more_data = json.loads(json.dumps(doc))
    more_data["experiments"][0]["arms"]["b"] = {"runs": 2, "states": {"failed": 1}}
    assert _shape_problems({"status": [more_data]}, {"status": {str(n): sorted(base)}}) == []
    added = json.loads(json.dumps(doc))
    added["experiments"][0]["runs"][0]["new_field"] = 1
    [problem] = _shape_problems({"status": [added]}, {"status": {str(n): sorted(base)}})
    assert "added ['experiments.runs.new_field']" in problem and "new number" in problem
    removed = json.loads(json.dumps(doc))
    del removed["experiments"][0]["runs"][0]["state"]
    [problem] = _shape_problems({"status": [removed]}, {"status": {str(n): sorted(base)}})
    assert "removed ['experiments.runs.state']" in problem
    renumbered = {**doc, "schema": 7}
    assert any("says schema 7" in p for p in _shape_problems({"status": [renumbered]}, {"status": {str(n): sorted(base)}}))
    assert base <= set(_recorded()["status"][str(n)]), "the planted document is not a status document"
