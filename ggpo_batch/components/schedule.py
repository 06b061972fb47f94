"""Scheduling the nightly tier through RQ, and the once-per-night guard.

Two RQ-native ways, both enqueueing the same data-only job (`nightly_job`, kwargs are strings):
- RQ 2's cron: `rq cron tools/nightly/rq_cron.py` calls `register_cron`, which registers the job
  with the suite's cron expression;
- `enqueue_next_night`: `Queue.enqueue_at` for the next scheduled time, run by
  `rq worker --with-scheduler`; each night's job schedules the following one.
RQ's cron has no leader election (two `rq cron` processes both enqueue) and a scheduled job may
also be enqueued by hand, so `nightly_job` first claims the night (`claim_night`): a Redis
`SET NX` on a per-suite, per-night key; the loser returns without running anything.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from croniter import croniter
from redis import Redis
from rq import Queue, get_current_job
from rq.job import Job

from .night import artifact_path, run_night
from .suite import DEFAULT_SUITE, Suite, load_suite

log = logging.getLogger(__name__)

CLAIM_TTL_SECONDS = 3 * 24 * 3600
KEY_PREFIX = "ggpo:nightly:claim"


def night_of(moment: datetime) -> date:
    """The night a run belongs to: the UTC calendar date of its (scheduled) start."""
    if moment.tzinfo is None:
        raise ValueError("night_of needs an aware datetime")
    return moment.astimezone(timezone.utc).date()


def next_run_after(cron: str, moment: datetime) -> datetime:
    """The next scheduled start strictly after `moment`, in UTC."""
    return croniter(cron, moment.astimezone(timezone.utc)).get_next(datetime)


def claim_key(suite_name: str, night: date) -> str:
    return f"{KEY_PREFIX}:{suite_name}:{night.isoformat()}"


def claim_night(connection: Redis, suite_name: str, night: date, holder: str) -> bool:
    """Claim `night` for `holder`; False when someone already claimed it (run at most once a night)."""
    return bool(connection.set(claim_key(suite_name, night), holder, nx=True, ex=CLAIM_TTL_SECONDS))


def claim_holder(connection: Redis, suite_name: str, night: date) -> str | None:
    raw = connection.get(claim_key(suite_name, night))
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class NightResult:
    night: str
    ran: bool
    artifacts: tuple[str, ...] = ()
    holder: str | None = None


def nightly_job(suite_path: str, output_dir: str, night: str | None = None,
                reschedule: bool = False) -> dict[str, Any]:
    """What the RQ worker runs: claim the night, run every method of the suite, write the artifacts.

    Only call inside an RQ job (the Redis connection is the job's own). With `reschedule` (the
    `enqueue_at` chain) the next night is scheduled first, so a failing night does not end the chain.
    Returns a plain dict.
    """
    job = get_current_job()
    if job is None:
        raise RuntimeError("nightly_job runs inside an RQ job; use run_nightly directly otherwise")
    suite = load_suite(Path(suite_path))
    the_night = date.fromisoformat(night) if night else night_of(job.enqueued_at or datetime.now(timezone.utc))
    if reschedule:
        after = datetime.combine(the_night, datetime.max.time(), tzinfo=timezone.utc)
        enqueue_next_night(job.connection, suite, Path(output_dir), now=max(after, datetime.now(timezone.utc)))
    if not claim_night(job.connection, suite.name, the_night, job.id):
        holder = claim_holder(job.connection, suite.name, the_night)
        log.info("night %s of %s already claimed by %s; not running again", the_night, suite.name, holder)
        return NightResult(night=the_night.isoformat(), ran=False, holder=holder).__dict__
    command = " ".join(shlex.quote(x) for x in (
        "rq-job", job.id, f"{nightly_job.__module__}.nightly_job", suite_path, output_dir, the_night.isoformat()))
    artifacts = [str(p) for p, _rec in run_night(suite, Path(output_dir), the_night, command)]
    return NightResult(night=the_night.isoformat(), ran=True, artifacts=tuple(artifacts), holder=job.id).__dict__


def job_kwargs(suite: Suite, output_dir: Path) -> dict[str, str]:
    return {"suite_path": str(suite.path), "output_dir": str(output_dir)}


def register_cron(suite: Suite, output_dir: Path) -> dict[str, Any]:
    """Register the nightly job with RQ's cron (call from the config file `rq cron` loads)."""
    from rq import cron

    return cron.register(nightly_job, queue_name=suite.schedule.queue, kwargs=job_kwargs(suite, output_dir),
                         cron=suite.schedule.cron, job_timeout=suite.schedule.job_timeout_seconds,
                         name=f"ggpo-nightly:{suite.name}")


def enqueue_next_night(connection: Redis, suite: Suite, output_dir: Path,
                       now: datetime | None = None) -> Job:
    """Schedule the next night's job with `enqueue_at` (needs `rq worker --with-scheduler`).

    The job id names the suite and the night, so scheduling the same night twice updates one
    scheduled entry instead of adding a second; the claim still guards the run itself.
    """
    at = next_run_after(suite.schedule.cron, now or datetime.now(timezone.utc))
    the_night = night_of(at)
    queue = Queue(suite.schedule.queue, connection=connection)
    return queue.enqueue_at(at, nightly_job, job_id=f"ggpo-nightly-{suite.name}-{the_night.isoformat()}",
                            job_timeout=suite.schedule.job_timeout_seconds,
                            kwargs={**job_kwargs(suite, output_dir), "night": the_night.isoformat(),
                                    "reschedule": True})


def expected_nights(cron: str, start: datetime, end: datetime) -> list[date]:
    """The nights the schedule should have run in (start, end]."""
    nights: list[date] = []
    it = croniter(cron, start.astimezone(timezone.utc))
    while (t := it.get_next(datetime)) <= end.astimezone(timezone.utc):
        nights.append(night_of(t))
    return sorted(set(nights))


def missed_nights(cron: str, run_nights: Iterable[date], start: datetime, end: datetime) -> list[date]:
    """Scheduled nights in (start, end] with no run: a missed night must be visible, not silent."""
    ran = set(run_nights)
    return [n for n in expected_nights(cron, start, end) if n not in ran]


__all__ = [
    "DEFAULT_SUITE", "claim_night", "claim_holder", "enqueue_next_night", "expected_nights", "missed_nights",
    "next_run_after", "night_of", "nightly_job", "register_cron", "artifact_path",
]
