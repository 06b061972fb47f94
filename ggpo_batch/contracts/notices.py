"""What is notified: the kinds of event, which ledger transitions are one, and each notice's
dedupe key, subject line and fields. Pure data: the ledger writes what these functions return in
the transaction of the transition (`ledger/notifications.py`), reconcile what it observes.

A notice's `dedupe_key` is what makes it recorded once: it is unique in the outbox, so an event
seen twice (by two reconcilers, or by one on every pass) is written once. It is built of
[A-Za-z0-9._-] only. The key sent to receivers (`Idempotency-Key`, the e-mail's Message-ID) adds a
random part drawn when the notice is written, so two ledgers never send the same key.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RUN_FAILED = "run_failed"  # a run moved to failed or timeout
RUN_LOST = "run_lost"  # a run moved to lost (its worker or job vanished)
RUN_HUNG = "run_hung"  # a running attempt silent past the hung threshold (observed by reconcile)
EXPERIMENT_FINISHED = "experiment_finished"  # no run left queued, submitted or running (observed)
COST_DECISION = "cost_decision"  # a not_reproduced_high_cost or cost_accepted decision
NIGHTLY_MOVED = "nightly_moved"  # a nightly metric moved past the threshold (observed)
NIGHTLY_MISSED = "nightly_missed"  # a scheduled night with no component run (observed)
CANARY_FAILED = "canary_failed"  # the canary before a sweep failed: its held runs were cancelled
KINDS = (RUN_FAILED, RUN_LOST, RUN_HUNG, EXPERIMENT_FINISHED, COST_DECISION, NIGHTLY_MOVED, NIGHTLY_MISSED,
         CANARY_FAILED)

# The run moves that are notified, and as what.
_RUN_MOVE_KIND: Mapping[str, str] = {"failed": RUN_FAILED, "timeout": RUN_FAILED, "lost": RUN_LOST}
DEDUPE_KEY_MAX = 230
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_SUBJECT_MAX = 300


@dataclass(frozen=True)
class Notice:
    """One event to tell people about."""

    dedupe_key: str
    kind: str
    subject: str
    fields: dict[str, Any] = field(default_factory=dict)
    experiment_id: int | None = None

    def sent_key(self) -> str:
        """The idempotency key receivers see: the dedupe key and a random part, drawn once."""
        return f"{self.dedupe_key}.{uuid.uuid4().hex[:12]}"


def _key(*parts: object) -> str:
    return ".".join(_UNSAFE.sub("_", str(p)) for p in parts)[:DEDUPE_KEY_MAX]


def _line(text: str) -> str:
    one = " ".join(str(text).split())
    return one if len(one) <= _SUBJECT_MAX else one[:_SUBJECT_MAX - 3] + "..."


def run_moved(*, run_key: str, arm: str, seed: int, experiment_id: int | None, to_state: str,
              reason: str | None, actor: str, attempt_id: int | None) -> Notice | None:
    """The notice of a run's move, or None if that move is not notified."""
    kind = _RUN_MOVE_KIND.get(to_state)
    if kind is None:
        return None
    # Each attempt ends a run at most once; a run moved without one (never so far) is told once per move.
    which = f"a{attempt_id}" if attempt_id is not None else uuid.uuid4().hex[:12]
    return Notice(_key("run", to_state, run_key, which), kind,
                  _line(f"run {run_key} {to_state}" + (f": {reason}" if reason else "")),
                  {"run_key": run_key, "arm": arm, "seed": seed, "state": to_state, "reason": reason, "actor": actor,
                   "attempt_id": attempt_id}, experiment_id)


def canary_failed(*, run_key: str, experiment_id: int | None, reason: str | None, actor: str,
                  attempt_id: int | None) -> Notice:
    """The notice of a failed canary (its key `<run key>-canary`; once per attempt)."""
    which = f"a{attempt_id}" if attempt_id is not None else uuid.uuid4().hex[:12]
    return Notice(_key("canary", "failed", run_key, which), CANARY_FAILED,
                  _line(f"canary of {run_key} failed" + (f": {reason}" if reason else "")),
                  {"run_key": run_key, "reason": reason, "actor": actor, "attempt_id": attempt_id}, experiment_id)


def decided(*, decision_id: int, experiment_name: str, experiment_id: int | None, kind: str, actor: str,
            estimated_gpu_hours: float | None, cap_gpu_hours: float | None, reason: str | None) -> Notice:
    """The notice of a cost decision (`kind`: states.KIND_NOT_REPRODUCED or KIND_COST_ACCEPTED)."""
    cost = "" if estimated_gpu_hours is None else f", {estimated_gpu_hours:.1f} GPU-h estimated" + (
        f" (cap {cap_gpu_hours:.1f})" if cap_gpu_hours is not None else "")
    return Notice(_key("decision", decision_id), COST_DECISION,
                  _line(f"{experiment_name}: {kind} by {actor}{cost}" + (f": {reason}" if reason else "")),
                  {"experiment": experiment_name, "decision": kind, "decided_by": actor,
                   "estimated_gpu_hours": estimated_gpu_hours, "cap_gpu_hours": cap_gpu_hours, "reason": reason},
                  experiment_id)


def hung(*, run_key: str, attempt_id: int, attempt: int, job_id: str | None, experiment_id: int,
         silent_seconds: float, last_step: int | None, hung_after_seconds: float) -> Notice:
    """The notice of a running attempt that stopped showing signs of life."""
    step = f" at step {last_step}" if last_step is not None else " before its first heartbeat"
    return Notice(_key("run", "hung", run_key, f"a{attempt_id}"), RUN_HUNG,
                  _line(f"run {run_key} hung? attempt {attempt} (job {job_id or '-'}) silent for "
                        f"{silent_seconds:.0f} s{step}"),
                  {"run_key": run_key, "attempt": attempt, "job_id": job_id, "silent_seconds": round(silent_seconds, 1),
                   "last_step": last_step, "hung_after_seconds": hung_after_seconds}, experiment_id)


def experiment_finished(*, name: str, version: int, experiment_id: int, headline: str,
                        states: Mapping[str, int], spent_gpu_hours: float) -> Notice:
    """The notice of an experiment version none of whose runs is left to run."""
    return Notice(_key("experiment", "finished", f"{name}-v{version}"), EXPERIMENT_FINISHED, _line(headline),
                  {"experiment": name, "version": version, "states": dict(states),
                   "spent_gpu_hours": spent_gpu_hours, "headline": headline}, experiment_id)


def nightly_moved(*, method: str, night: str, compared_with: str | None, moved: Sequence[Mapping[str, Any]]) -> Notice:
    """The notice of a night whose metrics moved against the night before."""
    what = ", ".join(f"{m['metric']} {m['previous']:.4g} -> {m['current']:.4g}" for m in moved)
    return Notice(_key("nightly", "moved", method, night), NIGHTLY_MOVED,
                  _line(f"nightly {method} {night}: moved since {compared_with}: {what}"),
                  {"method": method, "night": night, "compared_with": compared_with, "moved": [dict(m) for m in moved]})


def nightly_missed(*, method: str, night: str) -> Notice:
    """The notice of a scheduled night that has no component run."""
    return Notice(_key("nightly", "missed", method, night), NIGHTLY_MISSED,
                  f"nightly {method}: no run for the night of {night}", {"method": method, "night": night})
