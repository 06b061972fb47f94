"""Scheduling the nightly tier through RQ's own scheduling.

Two RQ-native ways, both enqueueing the same data-only job (`nightly_job`; kwargs are strings):
- RQ 2's cron: `rq cron $PWD/tools/nightly/rq_cron.py` loads a config that calls `register_cron`,
  which registers the job with the suite's cron expression;
- `enqueue_next_night`: `Queue.enqueue_at` for the next scheduled time, run by
  `rq worker --with-scheduler`; each night's job schedules the following one first.
RQ's cron has no leader election (two `rq cron` processes both enqueue) and a job can also be
enqueued by hand, so the job itself claims the night in the ledger (`Ledger.claim_night`, a
unique (method, tier, night) row): a second job for the same night runs nothing.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from croniter import croniter
from redis import Redis
from rq import Queue, get_current_job
from rq.job import Job

from .suite import Suite, load_suite

log = logging.getLogger(__name__)


def night_of(moment: datetime) -> date:
    """The night a run belongs to: the UTC calendar date of its (scheduled) start."""
    if moment.tzinfo is None:
        raise ValueError("night_of needs an aware datetime")
    return moment.astimezone(UTC).date()


def next_run_after(cron: str, moment: datetime) -> datetime:
    """The next scheduled start strictly after `moment`, in UTC."""
    return croniter(cron, moment.astimezone(UTC)).get_next(datetime)


def nightly_job(suite_path: str, output_dir: str, night: str | None = None,
                reschedule: bool = False) -> list[dict[str, Any]]:
    """What the RQ worker runs: for each method of the suite, claim the night and run the tier.

    Only inside an RQ job: the Redis connection is the job's own; the ledger URL comes from the
    worker's settings (environment, read here at the edge). With `reschedule` (the `enqueue_at`
    chain) the next night is scheduled first, so a failing night does not end the chain.
    """
    from ..config.identity import acting, resolve
    from ..config.settings import load_settings
    from ..ledger import connect
    from .night import run_night

    job = get_current_job()
    if job is None:
        raise RuntimeError("nightly_job runs inside an RQ job; call components.night.run_night otherwise")
    suite = load_suite(Path(suite_path))
    the_night = date.fromisoformat(night) if night else night_of(job.enqueued_at or datetime.now(UTC))
    if reschedule:
        after = datetime.combine(the_night, datetime.max.time(), tzinfo=UTC)
        enqueue_next_night(job.connection, suite, Path(output_dir), now=max(after, datetime.now(UTC)))
    settings = load_settings()
    command = " ".join(shlex.quote(x) for x in (
        "rq-job", job.id, f"{__name__}.nightly_job", suite_path, output_dir, the_night.isoformat()))
    ledger = connect(settings.db_url)
    try:
        done = run_night(ledger, suite=suite, output_dir=Path(output_dir), night=the_night,
                         actor=acting(resolve(ledger.engine, settings).user, f"rq:{job.id}"), command=command)
    finally:
        ledger.engine.dispose()
    return [d.__dict__ for d in done]


def job_kwargs(suite: Suite, output_dir: Path) -> dict[str, str]:
    return {"suite_path": str(suite.path), "output_dir": str(output_dir)}


def register_cron(suite: Suite, output_dir: Path) -> dict[str, Any]:
    """Register the nightly job with RQ's cron (call from the config file that `rq cron` loads)."""
    from rq import cron

    return cron.register(nightly_job, queue_name=suite.schedule.queue, kwargs=job_kwargs(suite, output_dir),
                         cron=suite.schedule.cron, job_timeout=suite.schedule.job_timeout_seconds,
                         name=f"ggpo-nightly:{suite.name}")


def enqueue_next_night(connection: Redis, suite: Suite, output_dir: Path,
                       now: datetime | None = None) -> Job:
    """Schedule the next night's job with `enqueue_at` (needs `rq worker --with-scheduler`).

    The job id names the suite and the night, so scheduling the same night twice keeps one
    scheduled entry instead of adding a second; the ledger claim still guards the run itself.
    """
    at = next_run_after(suite.schedule.cron, now or datetime.now(UTC))
    the_night = night_of(at)
    queue = Queue(suite.schedule.queue, connection=connection)
    return queue.enqueue_at(at, nightly_job, job_id=f"ggpo-nightly-{suite.name}-{the_night.isoformat()}",
                            job_timeout=suite.schedule.job_timeout_seconds,
                            kwargs={**job_kwargs(suite, output_dir), "night": the_night.isoformat(),
                                    "reschedule": True})


def expected_nights(cron: str, start: datetime, end: datetime) -> list[date]:
    """The nights the schedule should have run in (start, end]."""
    nights: set[date] = set()
    it = croniter(cron, start.astimezone(UTC))
    while (t := it.get_next(datetime)) <= end.astimezone(UTC):
        nights.add(night_of(t))
    return sorted(nights)


def missed_nights(cron: str, run_nights: Iterable[date], start: datetime, end: datetime) -> list[date]:
    """Scheduled nights in (start, end] with no component run: a missed night is shown, never silent."""
    ran = set(run_nights)
    return [n for n in expected_nights(cron, start, end) if n not in ran]
