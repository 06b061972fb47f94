"""The run and attempt state machine: every state, the moves allowed between them, the named
sets other modules ask about, and the scheduler's vocabulary mapped onto it. Pure data: the
ledger enforces the moves, settlement decides them, executors report scheduler states.

A run: queued -> submitted -> running -> succeeded | failed | timeout | cancelled | lost, or
not_reproduced (decided before any GPU was spent). A run may be created `held`: in the ledger but
never on the queue (waiting for a canary, or for an earlier wave), until it is released (held ->
queued) or cancelled (held -> cancelled); ggpo_batch/control/holds.py. A run a failed canary cancelled
goes back to held when the canary is re-run (cancelled -> held, `ggpo-batch canary --rerun`). A later wave the cost guard
refuses is decided not reproduced (held -> not_reproduced; ggpo_batch/control/waves.py). An attempt (one allocation): submitting ->
submitted -> running -> one of ATTEMPT_FINAL.
"""

from __future__ import annotations

from collections.abc import Mapping

RUN_STATES = ("queued", "submitted", "running", "succeeded", "failed", "timeout", "cancelled", "lost",
              "not_reproduced", "held")
HELD = "held"
# A run that may hold or be waiting for an allocation, be waiting on the queue, or be held off it
# (its estimate counts against the caps while it is held: a release does not check them again).
UNFINISHED_RUN_STATES = frozenset({HELD, "queued", "submitted", "running"})
# Runs that may carry a result record (one that ended, or was imported with its record).
RECORD_RUN_STATES = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost"})
# `status` lists these by default (with flagged succeeded runs): what needs a look.
ATTENTION_RUN_STATES = ("failed", "lost", "timeout", "running", "submitted", "queued", HELD)
# Cancel acts on these; retry (by hand) on RETRYABLE_RUN_STATES.
CANCELLABLE_RUN_STATES = UNFINISHED_RUN_STATES
RETRYABLE_RUN_STATES = ("failed", "timeout", "lost", "cancelled")
# Leaving one of these (back to queued) always needs a reason: a manual retry, an accepted cost,
# or an infrastructure retry the spec allows.
REASON_TO_LEAVE = frozenset({"failed", "timeout", "lost", "cancelled", "not_reproduced"})

RUN_MOVES: Mapping[str | None, frozenset[str]] = {
    None: frozenset({HELD, "queued", "not_reproduced", "succeeded", "failed", "timeout", "cancelled", "lost"}),
    # Released (put on the queue), cancelled, or decided not worth its cost; never submitted from here.
    HELD: frozenset({"queued", "cancelled", "not_reproduced"}),
    # lost / failed: the attempt never reached a scheduler (its worker died / sbatch refused it).
    "queued": frozenset({"submitted", "cancelled", "not_reproduced", "lost", "failed"}),
    "submitted": frozenset({"running", "succeeded", "failed", "timeout", "cancelled", "lost", "queued"}),
    "running": frozenset({"succeeded", "failed", "timeout", "cancelled", "lost", "queued"}),
    "failed": frozenset({"queued"}),
    "timeout": frozenset({"queued"}),
    "lost": frozenset({"queued"}),
    # back to held only for a run a failed canary cancelled, by `canary --rerun` (ledger/canaries.py checks why)
    "cancelled": frozenset({"queued", HELD}),
    # back to queued when its cost is accepted; to held if it is of a sequential design's later wave
    "not_reproduced": frozenset({"queued", HELD}),
    "succeeded": frozenset(),
}

# Attempts that hold or wait for an allocation: they count against a queue's GPU quota.
IN_FLIGHT_ATTEMPT_STATES = ("submitting", "submitted", "running")
# Attempts with a job id the scheduler may still be running.
LIVE_JOB_ATTEMPT_STATES = frozenset({"submitted", "running"})
ATTEMPT_FINAL = frozenset({"succeeded", "failed", "timeout", "cancelled", "lost", "preempted", "node_fail"})
# Attempt ends caused by the infrastructure, not the training: the only ones a spec may retry.
INFRASTRUCTURE_ATTEMPT_STATES = frozenset({"preempted", "node_fail", "lost"})
# An attempt that never reached a scheduler ends as one of these.
UNSUBMITTED_ATTEMPT_END = frozenset({"lost", "failed"})
# What an attempt's GPU-hours were spent on: a run's training from its start (or a retry of it),
# the continuation of a run past a time limit in a new allocation (from the run's checkpoint), or
# an evaluation of the run's exported policy after training (ggpo_batch/control/evaluations.py).
# The kinds of a cost decision (costguard writes them; the ledger, settlement and reports read them).
KIND_NOT_REPRODUCED = "not_reproduced_high_cost"
KIND_COST_ACCEPTED = "cost_accepted"

ATTEMPT_KIND_TRAINING = "training"
ATTEMPT_KIND_CONTINUATION = "continuation"
ATTEMPT_KIND_EVALUATION = "evaluation"
# The canary before a sweep (contracts/canary_spec.py), booked on the run it stands for while that run is held.
ATTEMPT_KIND_CANARY = "canary"
ATTEMPT_KINDS = (ATTEMPT_KIND_TRAINING, ATTEMPT_KIND_CONTINUATION, ATTEMPT_KIND_EVALUATION, ATTEMPT_KIND_CANARY)
# The reason a failed canary cancels its held runs with starts with this: only those may go back to held.
CANARY_CANCEL_PREFIX = "canary failed: "
# The kinds that train the run: what the report's training figures (cost, retries) count.
TRAINING_ATTEMPT_KINDS = frozenset({ATTEMPT_KIND_TRAINING, ATTEMPT_KIND_CONTINUATION})

# An evaluation after training (one per succeeded run and outcome-set name): queued -> submitted ->
# running -> succeeded | failed | timeout | cancelled | lost, its run staying succeeded. Never
# retried but by hand (`retry RUN_KEY --evaluation NAME`): a failed one goes back to queued then.
EVALUATION_STATES = ("queued", "submitted", "running", "succeeded", "failed", "timeout", "cancelled", "lost")
UNFINISHED_EVALUATION_STATES = frozenset({"queued", "submitted", "running"})
RETRYABLE_EVALUATION_STATES = ("failed", "timeout", "lost", "cancelled")
EVALUATION_MOVES: Mapping[str | None, frozenset[str]] = {
    None: frozenset({"queued", "failed"}),  # failed: its data file was gone when settlement queued it
    "queued": frozenset({"submitted", "cancelled", "lost", "failed"}),
    "submitted": frozenset({"running", "succeeded", "failed", "timeout", "cancelled", "lost"}),
    "running": frozenset({"succeeded", "failed", "timeout", "cancelled", "lost"}),
    **{s: frozenset({"queued"}) for s in RETRYABLE_EVALUATION_STATES},
    "succeeded": frozenset(),
}

# The scheduler's vocabulary (Slurm's names; local and debug executors map onto it).
SCHEDULER_FINAL = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
                             "BOOT_FAIL", "DEADLINE", "LOST"})
SCHEDULER_NODE_FAILURE = frozenset({"NODE_FAIL", "BOOT_FAIL"})
SCHEDULER_INFRASTRUCTURE = frozenset({"PREEMPTED", "LOST"}) | SCHEDULER_NODE_FAILURE

# Scheduler final state -> attempt final state (anything unknown: failed).
ATTEMPT_STATE_OF: Mapping[str, str] = {
    "COMPLETED": "succeeded", "FAILED": "failed", "OUT_OF_MEMORY": "failed", "TIMEOUT": "timeout",
    "DEADLINE": "timeout", "CANCELLED": "cancelled", "PREEMPTED": "preempted", "NODE_FAIL": "node_fail",
    "BOOT_FAIL": "node_fail", "LOST": "lost",
}
# Attempt final state -> the run's state when no retry follows.
RUN_STATE_AFTER: Mapping[str, str] = {
    "succeeded": "succeeded", "failed": "failed", "timeout": "timeout", "cancelled": "cancelled",
    "preempted": "failed", "node_fail": "failed", "lost": "lost",
}


def attempt_state_of(scheduler_state: str) -> str:
    """The attempt state a scheduler's final state books (unknown states are failures)."""
    return ATTEMPT_STATE_OF.get(scheduler_state, "failed")


def can_move(src: str | None, dst: str) -> bool:
    """Is a run allowed to go from `src` (None: a new run) to `dst`?"""
    return dst in RUN_MOVES[src]


def evaluation_can_move(src: str | None, dst: str) -> bool:
    """Is an evaluation allowed to go from `src` (None: a new one) to `dst`?"""
    return dst in EVALUATION_MOVES[src]
