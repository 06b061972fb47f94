"""Held runs: in the ledger, never on the queue, until released or cancelled. The one mechanism for
runs that must wait for something outside themselves (a canary that has to pass first, an earlier
wave of the planner's sequential waves).

The API, for whoever holds runs:

- hold at creation: `enqueue_spec(..., hold=True)` (every new run of the spec), or the ledger's
  `create_experiment(..., initial_state="held")` / `states=[...]` (per run) / `add_runs(..., state="held")`.
  A held run is `UNFINISHED` (its estimate counts against the caps; `cleanup` leaves it alone) and
  in `status`'s default view; `reconcile` and a repeated `enqueue` never put it on the queue (they
  queue only `queued` runs, and an enqueue adds only runs the ledger does not have).
- `release(ledger, settings, name, version, ...)`: held -> queued in one ledger transaction, then
  onto the queue by priority, as enqueue puts them (`RunQueue.enqueue_by_priority`). The ledger
  first: a failure on Redis leaves them queued in the ledger, which reconcile puts back on the queue.
- `cancel_held(ledger, settings, name, version, reason=...)`: held -> cancelled with the reason
  (`cancel_runs`, so the same path as `ggpo-batch cancel`, which also cancels held runs).

`run_keys` narrows either to some of the version's runs (a wave). CLI: `ggpo-batch release
EXPERIMENT[@VERSION]`, `ggpo-batch cancel RUN_KEY | --experiment NAME`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from ..config.settings import Settings
from ..contracts.states import HELD
from ..errors import LedgerError
from ..ledger import Ledger
from .interventions import cancel_runs
from .queue import RunQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Released:
    experiment: str
    version: int
    queue: str
    run_keys: list[str]  # held -> queued by this call
    enqueued: int  # of them, put on the queue now


def _version(ledger: Ledger, name: str, version: int | None):  # type: ignore[no-untyped-def]
    versions = ledger.experiments(name)
    exp = versions[-1] if versions and version is None else next((e for e in versions if e.version == version), None)
    if exp is None:
        raise LedgerError(f"no experiment {name!r}" + (f" version {version}" if version is not None else ""))
    return exp


def held_run_keys(ledger: Ledger, name: str, version: int | None = None) -> list[str]:
    """The held runs of an experiment version (default: the latest)."""
    exp = _version(ledger, name, version)
    return [r.run_key for r in ledger.runs(experiment_id=exp.id, states=[HELD], with_attempts=False)]


def release(ledger: Ledger, settings: Settings, name: str, version: int | None = None, *, actor: str,
            reason: str | None = None, run_keys: Iterable[str] | None = None) -> Released:
    """Put the held runs of an experiment version (default: the latest; or those of `run_keys`) on
    the queue: held -> queued in the ledger, then on Redis by priority."""
    exp = _version(ledger, name, version)
    moved = ledger.release_held(exp.id, actor=actor, reason=reason or f"released by {actor}", run_keys=run_keys)
    queue_name = settings.queue_for(exp.queue)
    n = 0
    if moved:
        queue = RunQueue.from_url(settings.redis_url, queue_name)
        queue.forget(list(moved))
        n = queue.enqueue_by_priority(moved.items())
    log.info("released %d held run(s) of %s v%d onto %s", len(moved), exp.name, exp.version, queue_name)
    return Released(exp.name, exp.version, queue_name, list(moved), n)


def cancel_held(ledger: Ledger, settings: Settings, name: str, version: int | None = None, *, actor: str,
                reason: str, run_keys: Iterable[str] | None = None) -> list[str]:
    """Cancel the held runs of an experiment version (or those of `run_keys`) with `reason` (a failed
    canary's); returns the keys cancelled. Runs no longer held are left alone."""
    keys = held_run_keys(ledger, name, version)
    if run_keys is not None:
        wanted = set(run_keys)
        keys = [k for k in keys if k in wanted]
    done = cancel_runs(ledger, settings, keys, actor=actor, reason=reason, only=frozenset({HELD}))
    return [c.run_key for c in done]
