"""The ledger's figures as Prometheus metrics, read at scrape time: the dashboard's `/metrics`.

One collector (prometheus_client's custom-collector protocol) asks the ledger for its figures
(`Ledger.ledger_figures`, a few GROUP BY queries) each time it is collected, so the figures are
exposed once for the whole team, by whoever serves the dashboard, not per worker. Gauges, since a
run moves between states: alert on a rise with `delta()` (docs/operator.md has the rules).

    ggpo_runs{queue, state}                      runs in each state (every state of contracts/states.py, 0 included)
    ggpo_held_runs{queue}                        runs held (0 while no run state is named held)
    ggpo_active_attempts{queue}                  attempts submitting, submitted or running
    ggpo_gpu_hours_booked{queue}                 GPU-hours booked over every attempt (scheduler's figure, else the job's)
    ggpo_outbox_pending                          notifications with a delivery still due
    ggpo_outbox_failed_deliveries                deliveries given up for good
    ggpo_outbox_oldest_pending_age_seconds       age of the oldest pending notification (0: none)
    ggpo_last_reconcile_age_seconds              since the last completed reconcile cycle (absent: never, or Redis away)
    ggpo_ledger_up                               1 when the figures could be read, else 0 (and no other ledger figure)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..contracts.states import RUN_STATES
from ..ledger import Ledger

log = logging.getLogger(__name__)

HELD_STATE = "held"  # a run kept out of the queue on purpose; counted 0 while no run state has the name


class LedgerCollector:
    """Collected at each scrape: the ledger's figures. `default_queue`: the label of experiments that
    name no queue; `last_reconcile()`: unix seconds of the last reconcile cycle, or None."""

    def __init__(self, ledger: Ledger, *, default_queue: str,
                 last_reconcile: Callable[[], float | None] | None = None) -> None:
        self.ledger = ledger
        self.default_queue = default_queue
        self.last_reconcile = last_reconcile

    def describe(self) -> list[Any]:
        return []  # collected only when scraped (registering it must not query the ledger)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("ggpo_ledger_up", "1 when the ledger's figures could be read at this scrape.")
        try:
            figures = self.ledger.ledger_figures()
        except Exception as exc:
            log.warning("metrics: the ledger's figures could not be read: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            yield from self._reconcile_age(GaugeMetricFamily)
            return
        up.add_metric([], 1)
        yield up
        q = self._queue
        runs = GaugeMetricFamily("ggpo_runs", "Runs in each state, per queue.", labels=["queue", "state"])
        counts: dict[tuple[str, str], int] = {}
        for (queue, state), n in figures.runs.items():
            counts[(q(queue), state)] = counts.get((q(queue), state), 0) + n
        queues = sorted({queue for queue, _ in counts} | {q(x) for x in figures.active_attempts})
        states = list(dict.fromkeys([*RUN_STATES, *sorted({s for _, s in counts})]))
        for queue in queues:
            for state in states:
                runs.add_metric([queue, state], counts.get((queue, state), 0))
        yield runs
        held = GaugeMetricFamily("ggpo_held_runs", "Runs held, per queue (0 while no run state is held).",
                                 labels=["queue"])
        active = GaugeMetricFamily("ggpo_active_attempts", "Attempts submitting, submitted or running, per queue.",
                                   labels=["queue"])
        booked = GaugeMetricFamily("ggpo_gpu_hours_booked", "GPU-hours booked over every attempt, per queue.",
                                   labels=["queue"])
        by_queue_active: dict[str, int] = {}
        by_queue_hours: dict[str, float] = {}
        for queue, n in figures.active_attempts.items():
            by_queue_active[q(queue)] = by_queue_active.get(q(queue), 0) + n
        for queue, gh in figures.gpu_hours.items():
            by_queue_hours[q(queue)] = by_queue_hours.get(q(queue), 0.0) + gh
        for queue in queues:
            held.add_metric([queue], counts.get((queue, HELD_STATE), 0))
            active.add_metric([queue], by_queue_active.get(queue, 0))
            booked.add_metric([queue], by_queue_hours.get(queue, 0.0))
        yield from (held, active, booked)
        yield GaugeMetricFamily("ggpo_outbox_pending", "Notifications with a delivery still due.",
                                value=figures.outbox_pending)
        yield GaugeMetricFamily("ggpo_outbox_failed_deliveries", "Notification deliveries given up for good.",
                                value=figures.outbox_failed)
        oldest = figures.outbox_oldest_pending
        yield GaugeMetricFamily("ggpo_outbox_oldest_pending_age_seconds",
                                "Seconds since the oldest pending notification was written (0: none pending).",
                                value=max(0.0, time.time() - oldest.timestamp()) if oldest is not None else 0.0)
        yield from self._reconcile_age(GaugeMetricFamily)

    def _queue(self, queue: str | None) -> str:
        return queue or self.default_queue

    def _reconcile_age(self, family: Any) -> Iterator[Any]:
        if self.last_reconcile is None:
            return
        try:
            at = self.last_reconcile()
        except Exception as exc:
            log.warning("metrics: the last reconcile's time could not be read: %s", type(exc).__name__)
            return
        if at is not None:
            yield family("ggpo_last_reconcile_age_seconds", "Seconds since the last completed reconcile cycle.",
                         value=max(0.0, time.time() - at))


def exposition(collector: LedgerCollector) -> tuple[bytes, str]:
    """(body, content type) of one scrape of `collector` in Prometheus' text format."""
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        generate_latest,
    )

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry), CONTENT_TYPE_LATEST
