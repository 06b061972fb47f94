"""Rank 0's live view of a training run, written from the training loop: the heartbeat, the
learning curve's points and the MLflow step metrics (train/job.py drives it)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from ...contracts.curve import append_points, point_of, start_curve
from ...contracts.heartbeat import Heartbeat, write_heartbeat

log = logging.getLogger(__name__)

# Seconds between two heartbeats (and MLflow writes) at most; every step in between is still logged.
HEARTBEAT_EVERY_SECONDS = 5.0
# Step figures kept in MLflow from the history entry of each step.
_STEP_METRICS = ("loss", "gradient_norm", "retained_groups", "raw_gap", "mean_length", "loop_seconds",
                 "logprob_gap_mean", "logprob_gap_p99", "clip_fraction", "kl")


def record_rates(history: list[dict[str, Any]], mean_reward: float | None, tokens_per_second: float | None) -> None:
    """The step's mean reward and generated tokens per second (over every rank) in its history entry,
    unless the trainer recorded them itself: the learning curve reads them from there."""
    if history:
        history[-1].setdefault("mean_reward", mean_reward)
        history[-1].setdefault("tokens_per_second", tokens_per_second)


class Progress:
    """Rank 0's live view of the run: the learning curve (ggpo_batch/contracts/curve.py; each step's point
    appended as the step ends: one line, so the dashboard's curve grows step by step), the heartbeat
    in the attempt folder and, when tracking is on, the step metrics of the attempt's MLflow run
    (ggpo_batch/train/run/tracking.py), those two written after a step at most every HEARTBEAT_EVERY_SECONDS and
    at every phase boundary. From the loop itself, not a timer: a job stuck in a collective stops
    beating, and status flags it hung."""

    def __init__(self, folder: Path, budget_seconds: float, tracking: Any = None) -> None:
        self.folder, self.budget_seconds, self.tracking = folder, budget_seconds, tracking
        self.pending: list[dict[str, Any]] = []
        self.mean_reward: float | None = None
        self.tokens_per_second: float | None = None
        self._written = 0.0

    def step(self, st: Any, mean_reward: float | None, tokens_per_second: float | None) -> None:
        """After a step: its curve point appended, its figures queued for MLflow, the heartbeat
        written when due."""
        self.mean_reward, self.tokens_per_second = mean_reward, tokens_per_second
        last = st.history[-1] if st.history else {}
        self.pending.append({"step": st.step, **{k: last.get(k) for k in _STEP_METRICS},
                             "mean_reward": mean_reward, "tokens_per_second": tokens_per_second})
        point = point_of(last)
        try:
            append_points(self.folder, [point] if point is not None else [])
        except OSError as exc:  # a full or read-only disk costs the live view, never the run
            log.warning("curve not written to %s: %s", self.folder, exc)
        if time.monotonic() - self._written >= HEARTBEAT_EVERY_SECONDS:
            self.beat(st)

    def begin(self, st: Any) -> None:
        """The attempt starts: its curve file holds the run's history so far (a resumed run's earlier
        steps), and the first heartbeat is written."""
        try:
            start_curve(self.folder, st.history)
        except OSError as exc:
            log.warning("curve not written to %s: %s", self.folder, exc)
        self.beat(st)

    def beat(self, st: Any) -> None:
        """Write the heartbeat now (and the queued step metrics)."""
        hb = Heartbeat(step=st.step, loop_seconds=st.loop_seconds, budget_seconds=self.budget_seconds,
                       mean_reward=self.mean_reward, tokens_per_second=self.tokens_per_second, updated_at=time.time())
        try:
            write_heartbeat(self.folder, hb)
        except OSError as exc:  # a full or read-only disk costs the live view, never the run
            log.warning("heartbeat not written to %s: %s", self.folder, exc)
        self._written = time.monotonic()
        if self.tracking is not None and self.pending:
            self.tracking.log_steps(self.pending)
        self.pending = []

    def end(self, status: str, files: tuple[Path, ...] = ()) -> None:
        """The attempt ended (FINISHED with its record, KILLED on a preemption, FAILED)."""
        if self.tracking is None:
            return
        if status == "FINISHED":
            self.tracking.finish(files)
        else:
            self.tracking.stop(status)
