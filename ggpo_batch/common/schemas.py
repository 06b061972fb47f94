"""The shapes of machine-readable output: every `--json` document (and the dashboard's API) carries
`"schema": N`, where N is its kind's number here. A shape changes only with its number.

One home for the numbers, for what each document is, and for which of its objects are maps keyed by
data (arm names, seeds, states) rather than by fields: `key_paths` folds those keys to `*`, so the
shape of a document is its set of field paths. `tests/test_json_schemas.py` records the shape of
every number it has seen (`tests/data/json_shapes.json`, append-only) and fails when a document's
shape differs from the one recorded for its number; `docs/json.md` is generated from that record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Schema:
    number: int
    produced_by: str  # the command (or API route) that prints it
    description: str
    # Dotted paths (lists are transparent, `*` stands for any key) of the objects keyed by data.
    maps: tuple[str, ...] = ()
    # Paths of fields that hold a document of another contract (the spec's `[train]` table, whose keys
    # are the spec reference's): present in the shape, their contents not.
    opaque: tuple[str, ...] = ()


# `changes`: arm -> field -> [baseline's value, arm's value] (contracts/arm_train.py); a value is any
# [train] value, so the pair's contents are opaque.
_ARM_FIGURES = ("arms", "arms.*.states", "totals.states", "changes", "changes.*")
_STATUS_MAPS = tuple(f"experiments.{p}" for p in _ARM_FIGURES)
_STATUS_OPAQUE = ("experiments.changes.*.*",)
# `paired_vs_baseline`: arm -> metric -> paired figures, whose `per_seed` is keyed by seed.
_PAIRED_MAPS = ("paired_vs_baseline", "paired_vs_baseline.*.*.per_seed")
_REPORT_MAPS = ("arms", "arms.*.states", "arms.*.per_seed", "arms.*.exposure_templates", *_PAIRED_MAPS,
                "changes", "changes.*", "power.arms")
_REPORT_OPAQUE = ("train", "changes.*.*")

SCHEMAS: dict[str, Schema] = {
    "status": Schema(6, "ggpo-batch status --json; GET /api/status",
                     "Per experiment version: totals and per-arm figures, its baseline arm and what each arm "
                     "changes against it (`changes`), the runs listed (each with its provenance: "
                     "code, environment, hardware, spec hash), its canaries while runs are held for one or were "
                     "cancelled by one (6: `canaries`); then the experiments decided before anything was "
                     "queued. Streamed: `schema` is on the first line.",
                     _STATUS_MAPS, _STATUS_OPAQUE),
    "components": Schema(1, "ggpo-batch status --components --json; GET /api/components",
                         "The nightly component tier per method: last nights, moved metrics, missed nights.",
                         ("components", "components.*.nights.metrics", "components.*.moved")),
    "report": Schema(6, "ggpo-batch report NAME --json (or --format json)",
                     "One experiment's outcome per arm with intervals, paired differences, cost; warnings first. "
                     "`outcome_set` says whose outcome (`report --outcomes`); `train` is the spec's `[train]` "
                     "table as the run specs hold it; `changes`, per arm, the fields it changes against the "
                     "baseline: field -> [baseline's, arm's]; `power`: per arm what the seeds run could detect; "
                     "`canaries`: the canaries before the sweep, their checks and GPU-hours (6: `canaries`, "
                     "`totals.canary_gpu_hours`).",
                     _REPORT_MAPS, _REPORT_OPAQUE),
    "report_comparison": Schema(6, "ggpo-batch report A B --json",
                                "Two experiments (or versions) side by side; `changes`: per arm, what it changes "
                                "against the baseline in A and in B.",
                                ("arms", *_PAIRED_MAPS, "changes", "changes.*.a", "changes.*.b",
                                 *(f"{side}.{p}" for side in ("a", "b") for p in _REPORT_MAPS)),
                                ("changes.*.a.*", "changes.*.b.*",
                                 *(f"{side}.{p}" for side in ("a", "b") for p in _REPORT_OPAQUE))),
    "enqueue": Schema(3, "ggpo-batch enqueue SPEC --json", "The runs expanded from a spec, what was queued, the "
                      "cost estimate (with the canaries' allocations) and the preflight's facts; per arm (`arms`) "
                      "its runs, their estimated GPU-hours, whether the sweep made it and what it changes against "
                      "the baseline; the runs held and the canaries started (3: `held`, `canaries`).",
                      ("preflight", "arms.changes"), ("preflight.*", "arms.changes.*")),
    "cancel": Schema(2, "ggpo-batch cancel --json", "The runs (or, with --evaluation, the evaluations after "
                     "training) cancelled and what each was before."),
    "evaluate": Schema(1, "ggpo-batch evaluate EXPERIMENT --data FILE --name NAME --json", "The evaluations "
                       "after training queued (or already there) per succeeded run, the runs left out and why."),
    "reconcile": Schema(2, "ggpo-batch reconcile --json", "What one reconcile pass polled, ended, started, "
                        "put back on the queue, and the looks of sequential designs it took (2: `looks`)."),
    "canary": Schema(1, "ggpo-batch canary NAME[@VERSION] --json", "The canaries before the sweep of an experiment "
                     "version, one per shape (model, rollout, ZeRO stage, tensor parallel size): state, reason, "
                     "attempts, GPU-hours, job ids, each check's name and result; `rerun`: the canaries queued "
                     "again by --rerun."),
    "decide": Schema(1, "ggpo-batch decide NAME --not-reproduced --json", "The decision recorded and the queued "
                     "runs it marked not_reproduced."),
    "logs": Schema(2, "ggpo-batch logs RUN_KEY --json", "An attempt's log files (paths, sizes, and why one is "
                   "not shown: `problem`), no content."),
    "nightly": Schema(1, "ggpo-batch nightly --json", "Each method's night: whether it ran, its artifact and "
                      "record, or who had already claimed it."),
    "db_current": Schema(1, "ggpo-batch db current --json", "The ledger's schema revision and the one this code "
                         "needs."),
    "ledger_import": Schema(1, "ggpo-batch ledger import FILE --json", "The experiment an import created (or found "
                            "already there) and its GPU-hours."),
    "ledger_export": Schema(2, "ggpo-batch ledger export --format json", "Runs and attempts as flat rows for a "
                            "notebook (an attempt's `kind`: training, continuation, evaluation, canary; a run's "
                            "`allocated_gpu_hours`: its training's). Streamed: `schema` is on the first line."),
    "costs": Schema(1, "ggpo-batch costs --json; GET /api/costs", "GPU-hours booked, attempts and GPU-hours "
                    "decided not spent, one row per user, experiment, queue or month (`by`), then the totals."),
    "dashboard_experiment": Schema(8, "GET /api/experiments/NAME", "The experiment page's live table "
                                   "(`status`) and its report (`report`).",
                                   (*(f"status.{p}" for p in _ARM_FIGURES), *(f"report.{p}" for p in _REPORT_MAPS)),
                                   ("status.changes.*.*", *(f"report.{p}" for p in _REPORT_OPAQUE))),
    "gc": Schema(1, "ggpo-batch gc --json", "What was (or, with --dry-run, would be) removed per finished run, "
                 "what was freed, the live runs left alone."),
    "dashboard_run": Schema(5, "GET /api/runs/RUN_KEY", "The run page: the run, its attempts with their "
                            "heartbeats, provenance and log tails (or why a log is not shown: `problem`), its "
                            "evaluations after training, its events."),
    "config": Schema(1, "ggpo-batch config --json", "Every setting as the commands use it (secrets masked) and "
                     "where it came from: the environment, a settings file, or the default; the settings files "
                     "looked at."),
    "notifications": Schema(1, "ggpo-batch notifications --json", "The outbox: pending and given-up counts, each "
                            "sink's deliveries by state and last error, the notifications not delivered everywhere."),
    "notification": Schema(1, "the body of a webhook POST (ggpo_batch/notify/senders.py)", "One notification: "
                           "Slack's `text`, its kind, idempotency key (also the Idempotency-Key header), time and "
                           "structured fields (`fields`: what its kind says, e.g. `run_key`, `reason`; keyed by "
                           "name; a field's value may be any JSON).", ("fields",), ("fields.*",)),
    "curves": Schema(1, "GET /api/experiments/NAME/curves", "Learning curves: per arm and metric (mean reward, KL) "
                     "the mean over seeds and its band (lowest, highest seed) against loop seconds; the runs drawn, "
                     "booked or training now.", ("arms",)),
    "plan": Schema(1, "ggpo-batch plan SPEC --json", "Seeds each arm needs against the baseline for the [power] "
                   "effect (plug-in and robust), their GPU-hours, the smallest difference the spec's seeds detect, "
                   "the caps, and a sequential design's boundaries.",
                   ("arms",)),
    "advise": Schema(1, "ggpo-batch advise EXPERIMENT --json", "Per arm: the paired difference, its interval and "
                     "adjusted p, the smallest detectable difference, the seeds needed and a verdict (stop, add, "
                     "not_worth_it) with its reason.", ("arms", "arms.*.per_seed")),
}


def versioned(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """`payload` with its kind's `"schema": N`."""
    return {"schema": SCHEMAS[kind].number, **payload}


def stream_head(kind: str) -> str:
    """The opening of a streamed document, on its first line: `{"schema": N` (the caller goes on
    with `, "field": ...`)."""
    return f'{{"schema": {SCHEMAS[kind].number}'


def key_paths(kind: str, document: Any) -> set[str]:
    """The shape of `document`: the dotted path of every field (lists transparent, the keys of the
    kind's data-keyed maps folded to `*`)."""
    schema = SCHEMAS[kind]
    maps = {tuple(m.split(".")) for m in schema.maps}
    opaque = {tuple(m.split(".")) for m in schema.opaque}
    return set(_paths(document, (), maps, opaque))


def _paths(value: Any, where: tuple[str, ...], maps: set[tuple[str, ...]],
           opaque: set[tuple[str, ...]]) -> Iterator[str]:
    if isinstance(value, list):
        for item in value:
            yield from _paths(item, where, maps, opaque)
        return
    if not isinstance(value, dict) or where in opaque:
        return
    keyed_by_data = any(_matches(where, m) for m in maps)
    for key, item in value.items():
        step = "*" if keyed_by_data else str(key)
        path = (*where, step)
        yield ".".join(path)
        yield from _paths(item, path, maps, opaque)


def _matches(where: tuple[str, ...], pattern: tuple[str, ...]) -> bool:
    return len(where) == len(pattern) and all(p in ("*", w) for w, p in zip(where, pattern))


def markdown(recorded: Mapping[str, Mapping[str, Iterable[str]]]) -> str:
    """The reference page of every kind's current shape (`docs/json.md`), from the recorded shapes."""
    lines = ["# Machine-readable output", "",
             "Every `--json` document and every dashboard API response carries `\"schema\": N`. A document's",
             "shape (the fields below) changes only with its number; a script checks the number it reads.",
             "Lists are transparent in the paths (`runs.state` is the `state` of each element of `runs`); `*`",
             "stands for a key that is data (an arm name, a seed, a state). Generated from",
             "`ggpo_batch/common/schemas.py` and `tests/data/json_shapes.json` by `tests/test_json_schemas.py`",
             "(`GGPO_RECORD_JSON_SHAPES=1` records a new number's shape; a recorded one never changes).",
             "Each kind's JSON Schema, with the types of its fields (`tests/data/json_types.json`, recorded the",
             "same way), is `reference/json/KIND.schema.json`; the test suite validates every document against it.",
             ""]
    for kind, schema in SCHEMAS.items():
        paths = sorted(recorded.get(kind, {}).get(str(schema.number), ()))
        lines += [f"## `{kind}`, schema {schema.number}", "", f"{schema.description}", "",
                  f"Printed by: {schema.produced_by}.", "", "```"]
        lines += paths or ["(not recorded yet)"]
        lines += ["```", ""]
    return "\n".join(lines)


def dumps(kind: str, payload: Mapping[str, Any]) -> str:
    """`versioned(kind, payload)` as the CLI prints it (sorted keys, indented)."""
    return json.dumps(versioned(kind, payload), indent=2, sort_keys=True, default=str)
