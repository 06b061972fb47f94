"""What each dashboard page shows, as plain data from the library calls the CLI uses: `status`
(reporting/status.py), `report` (reporting/report.py, render.py, plots.py), the nightly history
(nightly/history.py), the ledger's runs, attempts and events, and the attempt folders' logs.
Nothing here computes a statistic or a cost; every figure comes from those modules.
"""

from __future__ import annotations

import base64
import logging
import tempfile
from collections.abc import Iterable
from typing import Any

from ..config.settings import Settings
from ..errors import LedgerError
from ..ledger import Ledger
from ..ledger.heartbeats import attempt_heartbeat
from ..reporting.report import experiment_report
from ..reporting.status import (
    StatusQuery,
    decided_experiments,
    experiment_status,
    iter_experiment_status,
    state_label,
)
from .logtail import attempt_tails

log = logging.getLogger(__name__)

# The live run table of an experiment lists this many runs at most (the rest: status --runs).
RUN_TABLE_LIMIT = 500
# Default nights and "moved" threshold of the nightly page: those of `status --components`.
NIGHTS, THRESHOLD = 14, 0.1


def queue_positions(settings: Settings):  # type: ignore[no-untyped-def]
    """`positions(queue, run_keys)` for reporting.status: where Redis has queued runs; nothing if
    Redis cannot be asked (the ledger is still shown, as `status` does)."""

    def lookup(queue: str, run_keys: list[str] | None) -> dict[str, dict[str, Any]]:
        from ..control.queue import RunQueue

        try:
            return RunQueue.from_url(settings.redis_url, settings.queue_for(queue or None)).positions(run_keys)
        except Exception as exc:  # noqa: BLE001  (the page must still show the ledger when Redis is down)
            log.warning("queue positions unavailable (%s); showing the ledger only", type(exc).__name__)
            return {}

    return None if settings.inline_queue else lookup


def status_document(ledger: Ledger, settings: Settings, *, experiment: str | None = None,
                    states: Iterable[str] = (), all_runs: bool = False, limit: int | None = None) -> dict[str, Any]:
    """Exactly what `ggpo-batch status --json [-e NAME] [-s STATE] [--runs] [--limit N]` prints:
    {"experiments": [summary + "runs"], "decided": [...]}, from the same calls with the same defaults."""
    query = StatusQuery.of(states, all_runs=all_runs, limit=limit)
    experiments = experiment_status(ledger, experiment=experiment, states=query.states, attention=query.attention,
                                    limit=query.limit, positions=queue_positions(settings),
                                    hung_after=settings.hung_after_seconds)
    return {"experiments": experiments,
            "decided": decided_experiments(ledger, experiment=experiment) if query.with_decided else []}


def with_labels(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Status rows with the state as `status` prints it (progress, hung) under "state_label"."""
    return [{**r, "state_label": state_label(r)} for r in rows]


def experiments_index(ledger: Ledger, settings: Settings) -> dict[str, Any]:
    """Every experiment version: its runs by state and GPU-hours spent, estimated and decided not
    spent, all from status's totals (computed in SQL: this page, refreshed every few seconds, costs
    the same at 100 runs and at 100,000); experiments decided before anything was queued."""
    out = []
    for summary, _rows in iter_experiment_status(ledger, hung_after=settings.hung_after_seconds):  # rows never read
        out.append({"experiment": summary["experiment"], "version": summary["version"],
                    "method": summary["method"], "source": summary["source"], "gpus": summary["gpus"],
                    "states": summary["totals"]["states"], "runs": summary["totals"]["runs"],
                    "attempts": summary["totals"]["attempts"], "hung_runs": summary.get("hung_runs", 0),
                    "spent_gpu_hours": summary["totals"]["allocated_gpu_hours"],
                    "estimated_gpu_hours": summary["estimated_gpu_hours"],
                    "decided_not_spent_gpu_hours": summary["decided_not_spent_gpu_hours"],
                    "max_gpu_hours": summary["max_gpu_hours"]})
    return {"experiments": out, "decided": decided_experiments(ledger)}


def _version(ledger: Ledger, name: str, version: int | None) -> int:
    versions = [e.version for e in ledger.experiments(name)]
    if not versions:
        raise LedgerError(f"no experiment {name!r} in the ledger")
    if version is None:
        return versions[-1]
    if version not in versions:
        raise LedgerError(f"experiment {name!r} has no version {version} (versions: "
                          f"{', '.join(map(str, versions))})")
    return version


def experiment_live(ledger: Ledger, settings: Settings, name: str, version: int | None = None) -> dict[str, Any]:
    """The live part of an experiment page: its status summary and every run's row (state as
    `status` prints it, attempts, heartbeat), RUN_TABLE_LIMIT at most."""
    version = _version(ledger, name, version)
    for summary, rows in iter_experiment_status(ledger, experiment=name, limit=RUN_TABLE_LIMIT,
                                                positions=queue_positions(settings),
                                                hung_after=settings.hung_after_seconds):
        if summary["version"] == version:
            return {**summary, "runs": with_labels(list(rows))}
    raise LedgerError(f"experiment {name!r} v{version} has no runs")


def experiment_results(ledger: Ledger, name: str, version: int | None = None) -> dict[str, Any]:
    """The report of one version (reporting/report.py), its tables as `report` lays them out
    (render.py), and its plots (plots.py) as PNG data URIs."""
    from ..reporting.plots import write_plots
    from ..reporting.render import footer_lines, report_tables

    rep = experiment_report(ledger, name, version=_version(ledger, name, version))
    with tempfile.TemporaryDirectory(prefix="ggpo-dashboard-") as tmp:
        plots = [{"name": p.stem, "uri": "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode("ascii")}
                 for p in write_plots(rep, tmp)]
    tables = [{"title": t.title, "columns": t.columns, "rows": t.rows} for t in report_tables(rep)]
    return {"report": rep, "tables": tables, "footer": footer_lines(rep), "plots": plots}


def experiment_curves_view(ledger: Ledger, settings: Settings, name: str, version: int | None = None,
                           baseline: str | None = None) -> dict[str, Any]:
    """The learning curves of one version (reporting/learning_curves.py: booked runs from the
    ledger, running ones from their jobs' curve files) and their SVG panels (charts.py)."""
    from ..reporting.learning_curves import experiment_curves
    from .charts import curve_panels, legend

    from ..reporting.report import experiment_baseline

    v = _version(ledger, name, version)
    curves = experiment_curves(ledger, name, v, jobs_dir=settings.jobs_dir)
    if baseline is None:  # the spec's own (report.experiment_baseline)
        exp = next(e for e in ledger.experiments(name) if e.version == v)
        baseline = experiment_baseline(ledger, exp, sorted(curves["arms"]))
    base = baseline if baseline in curves["arms"] else None
    return {"curves": curves, "baseline": baseline, "panels": curve_panels(curves, base),
            "legend": legend(curves, base)}


def _attempt_row(settings: Settings, run: Any, a: Any, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    hb = attempt_heartbeat(a)
    return {"number": a.number, "executor": a.executor, "kind": a.kind, "job_id": a.job_id, "state": a.state,
            "scheduler_state": a.scheduler_state, "reason": a.reason, "worker": a.worker, "gpus": a.gpus,
            "submitted_at": a.submitted_at, "started_at": a.started_at, "ended_at": a.ended_at,
            "elapsed_seconds": a.elapsed_seconds, "gpu_hours_job": a.gpu_hours_job,
            "gpu_hours_scheduler": a.gpu_hours_scheduler, "exit_code": a.exit_code,
            "heartbeat": hb.to_dict() if hb else None, "provenance": provenance,
            **attempt_tails(settings.jobs_dir, run, a)}


def run_view(ledger: Ledger, settings: Settings, run_key: str) -> dict[str, Any]:
    """One run: its status row, every attempt (its heartbeat in the ledger, its provenance, its log
    tails), its events."""
    from ..reporting.status import run_row

    run = ledger.get_run(run_key)
    evaluations = ledger.evaluations(run_ids=[run.id])
    provenance = ledger.attempt_provenance(a.id for a in run.attempts)
    latest = next((provenance[a.id] for a in reversed(run.attempts) if a.id in provenance), None)
    row = with_labels([run_row(run, {"provenance": latest}, hung_after=settings.hung_after_seconds,
                               evaluations={run.id: [(e.name, e.state) for e in evaluations]})])[0]
    events = [{"at": e.at, "entity": e.entity, "from_state": e.from_state, "to_state": e.to_state,
               "actor": e.actor, "reason": e.reason} for e in ledger.events(run_key=run_key)]
    return {"run": row, "experiment": run.experiment.name, "version": run.experiment.version,
            "queue": settings.queue_for(run.experiment.queue),
            "attempts": [_attempt_row(settings, run, a, provenance.get(a.id)) for a in run.attempts], "events": events,
            "evaluations": [_evaluation_row(run, e) for e in evaluations]}


def _evaluation_row(run: Any, e: Any) -> dict[str, Any]:
    """An evaluation after training on the run page: its set, state, data and its attempts' numbers."""
    return {"key": e.key, "name": e.name, "state": e.state, "source": e.source, "gpus": e.gpus, "cause": e.cause,
            "data": e.spec.get("data_path"), "items": e.spec.get("items"),
            "attempts": [a.number for a in run.attempts if a.evaluation_id == e.id]}


def nightly_view(ledger: Ledger, *, nights: int = NIGHTS, threshold: float = THRESHOLD) -> dict[str, Any]:
    """What `status --components --json` prints: the nightly suite's methods, last nights, moved
    metrics and missed nights (nightly/history.py)."""
    from ..nightly.history import component_status
    from ..nightly.suite import load_suite

    suite = load_suite()
    return {"components": component_status(ledger, cron=suite.schedule.cron, nights=nights, threshold=threshold,
                                           methods=suite.methods)}

