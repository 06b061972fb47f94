"""Heartbeats in the ledger: reconcile copies each live attempt's last heartbeat onto its row
(attempts.heartbeat_*, migration 0004); status reads which running runs are hung.

A heartbeat is an observation, not a transition: it appends no event and never changes a state.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import bindparam, func, or_, select, update

from ..contracts.heartbeat import Heartbeat
from ..contracts.states import LIVE_JOB_ATTEMPT_STATES
from .core import LedgerCore
from .schema import Attempt, Run

# The SQL twin of `heartbeat.is_hung`: a running attempt's last sign of life is its heartbeat, or
# its start while it has written none. Hung: older than the cutoff (now - hung_after).
HUNG_SINCE = func.coalesce(Attempt.heartbeat_at, Attempt.started_at)


def heartbeat_time(hb: Heartbeat) -> datetime:
    """The heartbeat's `updated_at` as the ledger's UTC datetime."""
    return datetime.fromtimestamp(hb.updated_at, tz=UTC)


def attempt_heartbeat(att: Attempt) -> Heartbeat | None:
    """The heartbeat the ledger holds for an attempt, or None."""
    if att.heartbeat_at is None or att.heartbeat_step is None:
        return None
    return Heartbeat(step=att.heartbeat_step, loop_seconds=att.heartbeat_loop_seconds or 0.0,
                     budget_seconds=att.heartbeat_budget_seconds or 0.0, mean_reward=att.heartbeat_mean_reward,
                     tokens_per_second=att.heartbeat_tokens_per_second, updated_at=att.heartbeat_at.timestamp())


class HeartbeatRecords(LedgerCore):
    """Writes of heartbeats (reconcile) and the hung-run reads of status."""

    def record_heartbeats(self, beats: Sequence[tuple[int, Heartbeat]]) -> None:
        """Copy heartbeats onto their attempts (by attempt id), all in one statement. An attempt
        that has ended meanwhile, or already holds a newer heartbeat, is left as it is."""
        if not beats:
            return
        t = Attempt.__table__
        live = or_(*(t.c.state == st for st in sorted(LIVE_JOB_ATTEMPT_STATES)))  # no IN: executemany
        stmt = (update(t).where(t.c.id == bindparam("att_id"), live,
                                or_(t.c.heartbeat_at.is_(None), t.c.heartbeat_at < bindparam("at")))
                .values(heartbeat_step=bindparam("step"), heartbeat_loop_seconds=bindparam("loop"),
                        heartbeat_budget_seconds=bindparam("budget"), heartbeat_mean_reward=bindparam("reward"),
                        heartbeat_tokens_per_second=bindparam("tps"), heartbeat_at=bindparam("at")))
        rows = [{"att_id": att_id, "step": hb.step, "loop": hb.loop_seconds, "budget": hb.budget_seconds,
                 "reward": hb.mean_reward, "tps": hb.tokens_per_second, "at": heartbeat_time(hb)}
                for att_id, hb in beats]
        with self.session() as s:
            s.connection().execute(stmt, rows)

    def hung_count(self, experiment_id: int, *, cutoff: datetime) -> int:
        """Running runs of an experiment whose running attempt has shown no sign of life since `cutoff`."""
        with self.session() as s:
            return int(s.scalar(select(func.count(func.distinct(Run.id))).join(Attempt, Attempt.run_id == Run.id)
                                .where(Run.experiment_id == experiment_id, Run.state == "running",
                                       Attempt.state == "running", HUNG_SINCE < cutoff)) or 0)
