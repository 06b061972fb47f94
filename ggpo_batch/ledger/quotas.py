"""The GPU quotas an attempt begins under: a queue's GPUs in flight and one person's, checked in the
attempt's own transaction under a lock (attempts.py), so two workers cannot both pass a quota."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, func, select, text
from sqlalchemy.orm import Session

from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.states import IN_FLIGHT_ATTEMPT_STATES
from ..errors import LedgerError
from .core import LedgerCore
from .schema import Attempt, Experiment, Run

_RUN, _ATT, _EXP = Run.__table__, Attempt.__table__, Experiment.__table__


class QuotaExceeded(LedgerError):
    """Submitting would put a queue (or one person's runs) over its GPU quota; the run stays queued
    (deferred)."""

    def __init__(self, queue: str, used: int, gpus: int, limit: int, *, whose: str = "queue") -> None:
        super().__init__(f"{whose} {queue}: {used} GPUs in flight + {gpus} > quota {limit}")
        self.queue, self.used, self.gpus, self.limit = queue, used, gpus, limit
        self.priority = DEFAULT_PRIORITY


class UserQuota(NamedTuple):
    """The GPUs one person's runs may hold in flight: `default` (0: no limit), or for a member of
    one of `by_role`'s PostgreSQL roles the largest of theirs."""

    default: int
    by_role: tuple[tuple[str, int], ...] = ()


class QuotaChecks(LedgerCore):
    """The quota checks of attempt transitions, and the GPUs in flight."""

    def _check_user_quota(self, conn: Connection, owner: str, gpus: int, quota: UserQuota) -> None:
        """Raise QuotaExceeded if `owner`'s runs would hold more GPUs than their quota with `gpus`
        more; checked under a lock of theirs, so two workers cannot both pass it."""
        limit = self._user_limit(conn, owner, quota)
        if limit <= 0:
            return
        self._lock_queue(conn, f"user:{owner}")
        used = int(conn.scalar(select(func.coalesce(func.sum(_ATT.c.gpus), 0))
                               .join_from(_ATT, _RUN, _RUN.c.id == _ATT.c.run_id)
                               .join(_EXP, _EXP.c.id == _RUN.c.experiment_id)
                               .where(_ATT.c.state.in_(IN_FLIGHT_ATTEMPT_STATES), _EXP.c.created_by == owner)) or 0)
        if used + gpus > limit:
            raise QuotaExceeded(owner, used, gpus, limit, whose="user")

    @staticmethod
    def _user_limit(conn: Connection, owner: str, quota: UserQuota) -> int:
        """The quota of `owner`: the largest of the per-role limits of the PostgreSQL roles they are a
        member of, else the default. SQLite has no roles: the default."""
        if not quota.by_role or conn.dialect.name != "postgresql":
            return quota.default
        roles = [role for role, _ in quota.by_role]
        mine = set(conn.scalars(text(
            "SELECT r FROM unnest(CAST(:roles AS text[])) AS r WHERE to_regrole(:owner) IS NOT NULL "
            "AND to_regrole(r) IS NOT NULL AND pg_has_role(to_regrole(:owner), to_regrole(r), 'MEMBER')"),
            {"roles": roles, "owner": owner}))
        limits = [gpus for role, gpus in quota.by_role if role in mine]
        return max(limits) if limits else quota.default

    @staticmethod
    def _lock_queue(conn: Connection, queue: str) -> None:
        # SQLite already holds the write lock (BEGIN IMMEDIATE); PostgreSQL needs an explicit one.
        if conn.dialect.name == "postgresql":
            conn.execute(select(func.pg_advisory_xact_lock(func.hashtext(f"ggpo-quota:{queue}"))))

    @staticmethod
    def _in_flight(s: Connection | Session, queue: str | None) -> int:
        q = (select(func.coalesce(func.sum(Attempt.gpus), 0)).join(Run, Run.id == Attempt.run_id)
             .join(Experiment, Experiment.id == Run.experiment_id)
             .where(Attempt.state.in_(IN_FLIGHT_ATTEMPT_STATES)))
        if queue is not None:
            q = q.where(Experiment.queue == queue)
        return int(s.scalar(q) or 0)

    def in_flight_gpus(self, queue: str | None = None) -> int:
        """GPUs held or requested by attempts not yet ended (of one queue, if given)."""
        with self.session() as s:
            return self._in_flight(s, queue)
