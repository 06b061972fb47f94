"""docs/reference/records.md: the run result record (one entry of seeds/000), from the key lists and
stamps of ggpo_batch/contracts/run_record.py, and the details file beside it, from the keys the training job
writes (read from ggpo_batch/train/run/job.py's `details = {...}`: a key added there without a line here
stops the page from being written)."""

from __future__ import annotations

import ast

from ggpo_batch.common.datafiles import PACKAGE_DIR
from ggpo_batch.contracts import run_record as rr
from ggpo_batch.contracts.allocation import DETAILS_SUFFIX, POLICY_SUFFIX, RECORD_NAME

GENERATED = ("<!-- Generated from ggpo_batch/contracts/run_record.py and ggpo_batch/train/run/job.py (the details' keys) by "
             "`python tools/docs/reference.py`; tests/test_docs.py fails when it is stale. -->")
JOB = PACKAGE_DIR / "train" / "run" / "job.py"

# What each key of the details file holds.
DETAILS: dict[str, str] = {
    "run_key": "the run",
    "history": "one entry per step: loss, gradient norm, mean length, loop seconds, the step's mean reward and "
               "generated tokens per second, `weight_sync_seconds`, `weight_sync_probe`, and the figures a trainer "
               "adds (KL, clip fraction, log-prob gaps, importance weights), and the update's passes (`passes`: "
               "the step's forward/backward passes, the same on every rank; `filler_passes`: the empty ones of "
               "ranks that needed fewer, summed; `passes_padded_tokens` and `passes_nonpadding_tokens`: the loss "
               "rows' tokens as the passes pad them and unpadded, summed over ranks); the run's learning curve",
    "evaluation": "one row per held-out item: id, `exposed`, reward, gold answer and the answer(s); the decoding",
    "trained_item_ids": "every item trained on (an evaluation after training counts them as exposed)",
    "audit": "what the rollout audit checked and every problem (`audit.weight_sync_probe`: the run's probes)",
    "reward": "the run's rewards (`[train.task] reward`) and their counts (`math_unparsed`: completions math-verify "
              "could not parse in its time, scored 0)",
    "resumed": "whether this allocation resumed from a checkpoint",
    "world_size": "ranks of the allocation",
    "rollout": "the rollout backend",
    "allocations": "each allocation's share: elapsed seconds, steps, loop seconds",
    "allocation_elapsed_seconds": "this allocation's elapsed seconds (what the ledger books on this attempt)",
    "zero_stage": "DeepSpeed ZeRO stage",
    "under_submitit": "whether the job ran under submitit",
    "rank_policy_sha256": "every rank's digest of the weights it holds",
    "provenance": "code, environment, hardware and the run spec's sha256 (also `provenance.json` in the attempt "
                  "folder)",
    "policy_dir": f"the exported policy: `<record>{POLICY_SUFFIX}/`, a Hugging Face directory",
    "policy_sha256": "its sha256",
    "model": "`{path, resolved, dtype}` of `[train.model]`, or `builtin-byte-gpt2`",
    "data": "the `[train.data]` files, or `generated`",
    "tracking": "MLflow: on (its run), off (why) or none",
}
BLOCKS = {  # the record's blocks, their keys' tuple in run_record.py, and what they say
    "(top level)": (rr.RUN_KEYS, "one run: arm and seed, then its three blocks"),
    "training": (rr.TRAINING_KEYS, "the audit's stamp, counts and token costs"),
    "training.counts": (rr.COUNT_KEYS, "integers"),
    "training.cost": (rr.COST_KEYS, "token counts"),
    "training.cost (auxiliary arms)": (rr.AUX_COST_KEYS, "only for arms with the auxiliary answer loss"),
    "training.auxiliary_sources": (rr.AUX_SOURCE_KEYS, "only for arms with the auxiliary answer loss"),
    "budget": (rr.BUDGET_KEYS, "the loop-time budget reconciled with the exposure target"),
    "timing": (rr.TIMING_KEYS, "seconds and GPU-hours of the allocation(s)"),
}


def details_keys_in_job() -> list[str]:
    """The keys of the dict literal assigned to `details` in train/run/job.py."""
    for node in ast.walk(ast.parse(JOB.read_text())):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(isinstance(t, ast.Name) and t.id == "details" for t in node.targets)):
            return [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
    return []


def problems() -> list[str]:
    written = details_keys_in_job()
    out = [f"details.{k}: written by train/run/job.py, not described in tools/docs/records_md.py"
           for k in written if k not in DETAILS]
    out += [f"details.{k}: described in tools/docs/records_md.py, no longer written by train/run/job.py"
            for k in DETAILS if k not in written]
    return out


def markdown() -> str:
    found = problems()
    if found:
        raise SystemExit("tools/docs/records_md.py: " + "; ".join(found))
    lines = ["# Records reference", "", GENERATED, "",
             (f"A training attempt writes `{RECORD_NAME}` (the run result record) and `{RECORD_NAME}{DETAILS_SUFFIX}` "
             "(its details) in its attempt folder (`$GGPO_DATA_DIR/jobs/<run>/attempt-N/`). The record has the "
             "schema of one entry of the reference file `seeds/000` (`tests/data/000_b2e3fe1f0148d43c.txt`, keyed "
             "`\"<seed>/<arm>\"`), which `ledger import` reads too; `ggpo_batch/contracts/run_record.py` checks both. "
             "Units: seconds, GPU-hours, token counts. The JSON documents the commands print are in "
             "[json.md](../json.md)."), "",
             "## Stamps", "",
             ("Each stamp comes from a check that can fail "
             "([how it works](../how-it-works.md#stamps-of-a-runs-record) says which):"), "",
             "| field | stamp | otherwise |", "| --- | --- | --- |",
             f"| `training.status` | `{rr.TRAINING_STATUS_VALIDATED}` | `{rr.TRAINING_STATUS_AUDIT_FAILED}` |",
             f"| `budget.status` | `{rr.BUDGET_STATUS_RECONCILED}` | `{rr.BUDGET_STATUS_SHORT}` |", "",
             "## The run record", "", "| block | keys | |", "| --- | --- | --- |"]
    for block, (keys, note) in BLOCKS.items():
        lines.append(f"| `{block}` | {', '.join(f'`{k}`' for k in keys)} | {note} |")
    lines += ["", "## The details file", "", "| key | holds |", "| --- | --- |"]
    lines += [f"| `{k}` | {DETAILS[k]} |" for k in details_keys_in_job()]
    lines += ["", ("An evaluation after training writes its own small record, `evaluation.json`, not a seeds/000 "
              "entry ([the researcher's guide](../researcher.md#evaluation-after-training))."), ""]
    return "\n".join(lines)
