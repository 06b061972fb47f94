"""A run that reaches its allocation's time limit: whether its attempt's end continues the run in a
new allocation or ends it `timeout`, and how `status` says where a run is in its continuations.

The training job checkpoints before its time limit and says so in its attempt folder
(`allocation.TIME_LIMIT_NAME`: the step it reached, the step it resumed from, loop and budget
seconds, its own elapsed seconds), then exits; the executor reports the attempt TIMEOUT. Settlement
continues the run when all of these hold:

- the scheduler ended the attempt TIMEOUT and the job wrote that note (a job killed at its limit
  without checkpointing writes none: the run ends `timeout`, as it always did);
- the job advanced the run in this allocation (a job whose setup outlasts its allocation would
  otherwise be continued for nothing, max_continuations times);
- the spec sets `continue_on_timeout` (off by default: a researcher opts in);
- the run has continued fewer than `max_continuations` times (each earlier attempt that ended
  `timeout` is one continuation);
- the cost guard finds the next allocation under every cap (costguard.check_continuation).

The continuation is the run put back in the queue in the transaction that ends the attempt, so the
next attempt is begun like any other (its row before sbatch, found by its job name after a crash:
exactly once) and its kind is `continuation`. Its job resumes from the run's checkpoint folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..contracts.allocation import time_limit_path
from ..contracts.runspec import run_lifecycle
from ..contracts.states import ATTEMPT_KIND_CANARY

if TYPE_CHECKING:
    from ..ledger.schema import Attempt, Run
    from .costguard import CapCheck


@dataclass(frozen=True)
class TimeLimitNote:
    """What a job that stopped at its time limit wrote (allocation.TIME_LIMIT_NAME)."""

    step: int
    from_step: int
    loop_seconds: float
    budget_seconds: float
    elapsed_seconds: float
    loop_done: bool = False

    @property
    def progressed(self) -> bool:
        """Did this allocation advance the run (at least one step past its checkpoint)?"""
        return self.step > self.from_step

    @property
    def remaining_loop_seconds(self) -> float:
        return 0.0 if self.loop_done else max(0.0, self.budget_seconds - self.loop_seconds)


def read_note(folder: Path) -> TimeLimitNote | None:
    """The time-limit note of the attempt whose job wrote into `folder`; None if absent or unusable."""
    try:
        data = json.loads(time_limit_path(folder).read_text())
        note = TimeLimitNote(step=int(data["step"]), from_step=int(data["from_step"]),
                             loop_seconds=float(data["loop_seconds"]), budget_seconds=float(data["budget_seconds"]),
                             elapsed_seconds=float(data["elapsed_seconds"]), loop_done=bool(data.get("loop_done")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    numbers = (note.loop_seconds, note.budget_seconds, note.elapsed_seconds)
    return note if all(math.isfinite(x) and x >= 0 for x in numbers) else None


@dataclass(frozen=True)
class Verdict:
    """What the end of an attempt at its time limit means for its run."""

    continues: bool
    reason: str


def judge(run: Run, attempt: Attempt, note: TimeLimitNote | None, cost: CapCheck | None) -> Verdict:
    """Continue the run after `attempt` ended TIMEOUT, or end it `timeout` (module docstring). `cost`
    is the cost guard's check of the continuation (None: not checked, when none is possible)."""
    if note is None:
        return Verdict(False, "TIMEOUT: the job did not checkpoint at its time limit")
    where = (f"time limit: checkpointed at step {note.step} "
             f"({note.loop_seconds:.0f} of {note.budget_seconds:.0f} s of loop)")
    enabled, most = run_lifecycle(run.run_spec)
    resume = "`ggpo-batch retry` resumes it from its checkpoint"
    if not note.progressed:
        return Verdict(False, f"{where}: no step done in this allocation (is its setup longer than the time "
                              f"limit?); not continued")
    if not enabled:
        return Verdict(False, f"{where}; continue_on_timeout is off: {resume}")
    n = 1 + sum(1 for a in run.attempts if a.state == "timeout" and a.number != attempt.number
                and a.kind != ATTEMPT_KIND_CANARY)
    if n > most:
        return Verdict(False, f"{where}; no continuation left (max_continuations = {most}): {resume}")
    if cost is not None and not cost.ok:
        return Verdict(False, f"{where}; continuation refused by the cost guard: {cost.message}")
    return Verdict(True, f"{where}; continued after time limit ({n} of {most}) in a new allocation"
                         + (f"; {cost.message}" if cost is not None else ""))
