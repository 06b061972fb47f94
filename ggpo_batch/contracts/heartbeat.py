"""The heartbeat: a running job's progress in one small JSON file in its attempt folder.

Rank 0 of the training job rewrites `<attempt folder>/heartbeat.json` after each step (at most
every few seconds) and at the phase boundaries after the loop; reconcile copies it into the ledger
(attempts.heartbeat_*), `status` and the dashboard show it, and a running attempt whose last sign of
life (its heartbeat, or its start when it has none yet) is older than the hung threshold is flagged
hung. It is written from the training loop itself, never from a timer thread: a job stuck in a
collective must stop beating.

Writers replace the file atomically; readers never raise on a missing, half-written or foreign file
(they get None), because a reconcile cycle must not fail on one job's folder.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# The file, in the attempt folder (allocation.attempt_folder) beside the record.
HEARTBEAT_NAME = "heartbeat.json"
# A running attempt silent for longer than this is flagged hung (GGPO_HUNG_AFTER_SECONDS overrides it:
# ggpo_batch/config/settings.py). Ten minutes: far above a step or a checkpoint, far below a Slurm time limit.
HUNG_AFTER_SECONDS = 600.0
# Anything bigger is not a heartbeat this package wrote: not read.
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Heartbeat:
    """A job's progress: steps done, loop seconds of its budget, the last step's mean reward and
    generated tokens per second (over all ranks; None before the first step), and when it was
    written (`updated_at`, unix time)."""

    step: int
    loop_seconds: float
    budget_seconds: float
    mean_reward: float | None
    tokens_per_second: float | None
    updated_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Heartbeat | None:
        """The heartbeat in `data`, or None when any field is missing or not a sane value."""
        if not isinstance(data, dict):
            return None
        step = data.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            return None
        loop, budget, at = (_number(data.get(k)) for k in ("loop_seconds", "budget_seconds", "updated_at"))
        if loop is None or budget is None or at is None or loop < 0 or budget < 0 or at <= 0:
            return None
        reward, tps = data.get("mean_reward"), data.get("tokens_per_second")
        if (reward is not None and _number(reward) is None) or (tps is not None and (_number(tps) is None or tps < 0)):
            return None
        return cls(step=step, loop_seconds=loop, budget_seconds=budget, mean_reward=_number(reward),
                   tokens_per_second=_number(tps), updated_at=at)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def progress_text(hb: Mapping[str, Any]) -> str:
    """A heartbeat (its dict form) as `status`, the dashboard and the CLI's progress show it:
    `step 41  1830/2700 s` (steps done, loop seconds of the budget)."""
    return f"step {hb['step']}  {hb['loop_seconds']:.0f}/{hb['budget_seconds']:.0f} s"


def heartbeat_path(folder: Path) -> Path:
    """Where the job of the attempt in `folder` writes its heartbeat."""
    return Path(folder) / HEARTBEAT_NAME


def write_heartbeat(folder: Path, hb: Heartbeat) -> None:
    """Write `hb` into `folder` by an atomic replace: a reader sees the old heartbeat or the new one."""
    data = hb.to_dict()
    for k in ("mean_reward", "tokens_per_second"):  # NaN/inf are not JSON: unknown
        if data[k] is not None and not math.isfinite(data[k]):
            data[k] = None
    path = heartbeat_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_heartbeat(folder: Path) -> Heartbeat | None:
    """The heartbeat in `folder`; None if there is none or it cannot be read (never raises)."""
    try:
        with open(heartbeat_path(folder), "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
        if len(raw) > _MAX_BYTES:
            return None
        return Heartbeat.from_dict(json.loads(raw))
    except (OSError, ValueError, RecursionError):
        return None


def is_hung(last_sign_of_life: float | None, now: float, hung_after: float = HUNG_AFTER_SECONDS) -> bool:
    """Is a running attempt hung? Its last sign of life (unix time of its heartbeat, or of its start
    when it has written none) is more than `hung_after` seconds old. The ledger's SQL twin of this
    rule is `ledger.heartbeats.HUNG_SINCE` (ordering and counts); a test keeps them equal."""
    return last_sign_of_life is not None and now - last_sign_of_life > hung_after
