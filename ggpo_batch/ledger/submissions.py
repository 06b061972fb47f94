"""Beginning an attempt: a worker's first transaction reads the run (locked) with its spec, queue and
last attempt, checks the quotas (quotas.py) and writes the attempt row before the scheduler is asked.
The transitions after it are attempts.py's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from sqlalchemy import Connection, Row, and_, bindparam, func, insert, select

from ..contracts.priorities import DEFAULT_PRIORITY
from ..contracts.states import ATTEMPT_KIND_CONTINUATION, ATTEMPT_KIND_TRAINING
from ..errors import LedgerError
from .core import missing_run
from .events import RowEvents
from .quotas import QuotaChecks, QuotaExceeded, UserQuota
from .schema import Attempt, Experiment, Run, utcnow

_RUN, _ATT, _EXP = Run.__table__, Attempt.__table__, Experiment.__table__
_RUN_READ = ("id", "experiment_id", "run_key", "arm", "seed", "state", "retries_allowed", "cause", "worker",
             "updated_at")
_NEW_ATTEMPT = ("run_id", "number", "executor", "kind", "state", "gpus", "submitted_by", "worker", "created_at")

# The statements of a worker's first step, built once per process (see attempts.py).
_RUN_ROW = (select(*(_RUN.c[c] for c in _RUN_READ)).where(_RUN.c.run_key == bindparam("key"))
            .with_for_update())
# The run's last attempt, joined to its row: a worker's first step reads both in one round trip.
_LAST = _ATT.alias("last_attempt")
_LAST_READ = ("number", "state", "worker")
# Has an earlier attempt of the run ended at its time limit? Then the next one continues the run
# past it (from the run's checkpoint): its kind is continuation.
_TIMED_OUT = (select(func.count()).select_from(_ATT)
              .where(_ATT.c.run_id == _RUN.c.id, _ATT.c.state == "timeout").scalar_subquery())
_SUBMISSION_ROW = (select(*(_RUN.c[c] for c in _RUN_READ), _RUN.c.run_spec, _RUN.c.priority, _EXP.c.queue,
                          _EXP.c.created_by.label("owner"), *(_LAST.c[c].label(f"last_{c}") for c in _LAST_READ),
                          _TIMED_OUT.label("timed_out"))
                   .join_from(_RUN, _EXP, _EXP.c.id == _RUN.c.experiment_id)
                   .outerjoin(_LAST, and_(_LAST.c.run_id == _RUN.c.id,
                                          _LAST.c.number == select(func.max(_ATT.c.number))
                                          .where(_ATT.c.run_id == _RUN.c.id).scalar_subquery()))
                   .where(_RUN.c.run_key == bindparam("key")).with_for_update(of=_RUN))
_LAST_ATTEMPT = (select(*(_ATT.c[c] for c in _LAST_READ)).where(_ATT.c.run_id == bindparam("run"))
                 .order_by(_ATT.c.number.desc()).limit(1))
_RUN_TIMED_OUT = select(func.count()).select_from(_ATT).where(_ATT.c.run_id == bindparam("run"),
                                                              _ATT.c.state == "timeout")
_NEW_ATTEMPT_ROW = insert(_ATT)



class _Last(NamedTuple):
    """A run's latest attempt, as `_begin` needs it."""

    number: int | None
    state: str | None
    worker: str | None


class AttemptPlan(NamedTuple):
    """How to begin an attempt: its executor, its GPUs, the quota it must fit under ((queue, max
    GPUs in flight), or None), and the per-person quota of the run's owner (the experiment's
    creator), or None."""

    executor: str
    gpus: int
    quota: tuple[str, int] | None = None
    user_quota: UserQuota | None = None


class Submission(NamedTuple):
    """What `begin_submission` found and did: the run's state, spec and experiment queue as it
    locked them, and the attempt it began (None when the run was not queued); the run's priority
    and owner (who created its experiment)."""

    state: str
    run_spec: dict[str, Any]
    queue: str | None
    attempt: Attempt | None
    priority: str = DEFAULT_PRIORITY
    owner: str | None = None


class AttemptBeginnings(QuotaChecks):
    """Begin a run's next attempt, under the queue's and the person's GPU quotas."""

    def begin_attempt(self, run_key: str, *, executor: str, gpus: int, actor: str, worker: str | None,
                      quota: tuple[str, int] | None = None) -> Attempt:
        """Write the attempt row BEFORE the scheduler is asked, so a crash after sbatch is findable.

        `quota` = (queue, max GPUs in flight): checked in the same transaction under a lock, so two
        workers cannot both pass it; over quota raises QuotaExceeded and writes nothing. A run whose
        last attempt is still `submitting` belongs to whoever began it: only `resolve_submitting`
        (reconcile, after asking the scheduler) may settle it, so it is never submitted twice.
        """
        with self.transaction() as conn:
            run = self._run_row(conn, run_key)
            if run.state != "queued":
                raise LedgerError(f"run {run_key}: is {run.state}, only a queued run can be submitted")
            last = conn.execute(_LAST_ATTEMPT, {"run": run.id}).one_or_none()
            timed_out = bool(conn.scalar(_RUN_TIMED_OUT, {"run": run.id}))
            return self._begin(conn, run, last, AttemptPlan(executor, gpus, quota), actor=actor, worker=worker,
                               owner=None, continues=timed_out)

    def begin_submission(self, run_key: str, *, actor: str, worker: str | None,
                         plan: Callable[[dict[str, Any], str | None], AttemptPlan]) -> Submission:
        """A worker's first step, in one transaction: read the run (locked) with its spec and its
        experiment's queue, and if it is queued begin its next attempt as `plan(run_spec, queue)`
        says (`begin_attempt`'s checks and quota). A run that is not queued comes back as it is,
        with nothing written."""
        with self.transaction() as conn:
            row = conn.execute(_SUBMISSION_ROW, {"key": run_key}).one_or_none()
            if row is None:
                raise missing_run(conn, run_key)
            fields = row._asdict()
            run_spec, queue, priority, owner = (fields.pop(k) for k in ("run_spec", "queue", "priority", "owner"))
            last = _Last(*(fields.pop(f"last_{c}") for c in _LAST_READ))
            timed_out = bool(fields.pop("timed_out"))
            run = Run(**fields)
            if run.state != "queued":
                return Submission(run.state, run_spec, queue, None, priority, owner)
            try:
                att = self._begin(conn, run, last if last.number is not None else None, plan(run_spec, queue),
                                  actor=actor, worker=worker, owner=owner,
                                  continues=timed_out)
            except QuotaExceeded as exc:
                exc.priority = priority  # the deferred run goes back on its own priority's queue
                raise
            return Submission(run.state, run_spec, queue, att, priority, owner)

    def _begin(self, conn: Connection, run: Run, last: _Last | Row[Any] | None, plan: AttemptPlan, *, actor: str,
               worker: str | None, owner: str | None, continues: bool = False) -> Attempt:
        """Begin the next attempt of `run` (queued, locked by this transaction) after `last`, its
        latest attempt (number, state, worker; None if it has none), and end the transaction.
        `owner`: who created the run's experiment (read if None and the plan has a user quota).
        `continues`: an earlier attempt ended at its time limit, so this one is a continuation."""
        if last is not None and last.state == "submitting":
            raise LedgerError(f"run {run.run_key}: attempt {last.number} is being submitted by {last.worker}")
        if plan.quota is not None and plan.quota[1] > 0:
            queue, limit = plan.quota
            self._lock_queue(conn, queue)
            used = self._in_flight(conn, queue)
            if used + plan.gpus > limit:
                raise QuotaExceeded(queue, used, plan.gpus, limit)
        if plan.user_quota is not None:
            if owner is None:
                owner = conn.scalar(select(_EXP.c.created_by).where(_EXP.c.id == run.experiment_id))
            self._check_user_quota(conn, owner or "", plan.gpus, plan.user_quota)
        kind = ATTEMPT_KIND_CONTINUATION if continues else ATTEMPT_KIND_TRAINING
        att = Attempt(run_id=run.id, number=(last.number + 1) if last else 1, executor=plan.executor, kind=kind,
                      state="submitting", gpus=plan.gpus, submitted_by=actor, worker=worker, created_at=utcnow())
        att.id = conn.execute(_NEW_ATTEMPT_ROW, {c: getattr(att, c) for c in _NEW_ATTEMPT}).inserted_primary_key[0]
        events = RowEvents(actor)
        events.add(entity="attempt", to_state="submitting", run=run, attempt_id=att.id)
        with self.commit_after(conn) as update_row:
            events.write(conn)
            update_row(_RUN, run.id, {"worker": worker}, f"beginning run {run.run_key}")
        return att

    @staticmethod
    def _run_row(conn: Connection, run_key: str) -> Run:
        """The run, locked for this transaction, as a detached object read from one row (no
        experiment, no attempts): what the row-level transitions below check and change."""
        row = conn.execute(_RUN_ROW, {"key": run_key}).one_or_none()
        if row is None:
            raise missing_run(conn, run_key)
        return Run(**row._mapping)
