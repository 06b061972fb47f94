"""Notifications: recorded once in the ledger's outbox (in the transition's own transaction, or by
reconcile for what it observes), delivered at least once with a stable idempotency key to a real
webhook receiver and a real SMTP server on 127.0.0.1, through sinks that refuse connections or
accept them and never answer; a dead sink costs a reconcile pass one timeout and a transition
nothing. On SQLite and PostgreSQL."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from ggpo_batch.cli import cli
from ggpo_batch.common.netutil import free_port
from ggpo_batch.config.settings import load_settings
from ggpo_batch.contracts import notices as kinds
from ggpo_batch.control.reconcile import reconcile_now
from ggpo_batch.ledger import NewRun
from ggpo_batch.ledger.schema import utcnow
from ggpo_batch.notify.delivery import backoff
from ggpo_batch.notify.observe import NIGHT_GRACE, nightly, observe
from tests.support.paths import SEED_003
from tests.support.receivers import (
    BlackHole,
    HttpReceiver,
    Received,
    SmtpReceiver,
    stopping,
)
from tests.support.waiting import wait_until

TIMEOUT = 0.5  # seconds a delivery waits for a sink (GGPO_NOTIFY_TIMEOUT_SECONDS)


def _runs(name: str, seeds: range) -> list[NewRun]:
    return [NewRun(run_key=f"{name}-v1-{s}-clean", arm="clean", seed=s, config_hash="h", run_spec={}) for s in seeds]


def _experiment(led: Any, name: str, seeds: range) -> list[str]:
    runs = _runs(name, seeds)
    led.create_experiment(name=name, version=1, method="ggpo", source="spec", spec_hash=f"h-{name}", spec={}, gpus=4,
                          actor="alice", runs=runs)
    return [r.run_key for r in runs]


def _ran(led: Any, key: str, number: int = 1, started_at: datetime | None = None) -> None:
    led.begin_attempt(key, executor="local", gpus=4, actor="w", worker="w1")
    led.mark_submitted(key, number, job_id=f"{100 + number}", actor="w")
    led.mark_running(key, number, actor="w", started_at=started_at)


def make_events(led: Any, *, hung: bool) -> dict[str, str]:
    """Every kind of notified event (the hung run only with `hung`); returns dedupe key prefix -> kind
    of the notices they make (the observed ones once reconcile has looked)."""
    k = _experiment(led, "nt", range(1, 6))
    _ran(led, k[0])
    led.mark_finished(k[0], 1, attempt_state="failed", run_state="failed", actor="w", reason="exit code 1")
    led.begin_attempt(k[1], executor="local", gpus=4, actor="w", worker="w1")
    led.resolve_submitting(k[1], 1, job_id=None, actor="r", reason="worker died while submitting", state="lost")
    _ran(led, k[2])
    led.mark_finished(k[2], 1, attempt_state="succeeded", run_state="succeeded", actor="w")  # not notified
    _ran(led, k[3])
    led.mark_finished(k[3], 1, attempt_state="preempted", run_state=None, actor="w")  # a retry follows: not notified
    led.requeue(k[3], actor="r", reason="infrastructure retry 1/1")
    _ran(led, k[3], 2)
    led.mark_finished(k[3], 2, attempt_state="timeout", run_state="timeout", actor="w", reason="time limit")
    if hung:
        _ran(led, k[4], started_at=utcnow() - timedelta(hours=2))
    else:
        led.mark_cancelled(k[4], actor="bob", reason="not needed")  # not notified
    led.apply_decision(experiment_name="big", kind="not_reproduced_high_cost", actor="carol",
                       fields={"estimated_gpu_hours": 5000.0, "cap_gpu_hours": 100.0, "reason": "over the user cap"})
    f = _experiment(led, "fin", range(1, 3))
    _ran(led, f[0])
    led.mark_finished(f[0], 1, attempt_state="succeeded", run_state="succeeded", actor="w")
    _ran(led, f[1])
    led.mark_finished(f[1], 1, attempt_state="failed", run_state="failed", actor="w", reason="loss is nan")
    expected = {f"run.failed.{k[0]}": kinds.RUN_FAILED, f"run.lost.{k[1]}": kinds.RUN_LOST,
                f"run.timeout.{k[3]}": kinds.RUN_FAILED, "decision.": kinds.COST_DECISION,
                f"run.failed.{f[1]}": kinds.RUN_FAILED, "experiment.finished.fin-v1": kinds.EXPERIMENT_FINISHED}
    # nt has a run still running (hung), or every run ended: then it finished too.
    expected[f"run.hung.{k[4]}" if hung else "experiment.finished.nt-v1"] = kinds.RUN_HUNG if hung else \
        kinds.EXPERIMENT_FINISHED
    return expected


def _night(led: Any, night: str, scale: float) -> None:
    record = json.loads(SEED_003.read_text())
    moved = copy.deepcopy(record)
    moved["metrics"]["final_test_nll"]["mean"] *= scale
    cr = led.claim_night(method="ggpo", tier="l1_mechanism", night=night, actor="nightly")
    led.finish_component_run(cr.id, state="succeeded", record=moved, seconds=10.0, commit="abc", dirty=False)


def _outbox(led: Any) -> list[Any]:
    return [n for n, _ in led.notifications(undelivered=False, limit=1000)]


def _match(expected: dict[str, str], outbox: list[Any]) -> None:
    """Each expected event is in the outbox exactly once, as its kind, and nothing else is."""
    for prefix, kind in expected.items():
        found = [n for n in outbox if n.dedupe_key.startswith(prefix)]
        assert len(found) == 1 and found[0].kind == kind, (prefix, [n.dedupe_key for n in outbox])
    assert len(outbox) == len(expected), sorted(n.dedupe_key for n in outbox)


def _settings(db_url: str, tmp_path: Path, **notify: str) -> Any:
    env = {"GGPO_DB_URL": db_url, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester",
           "GGPO_HUNG_AFTER_SECONDS": "600"}
    return load_settings({**env, **{f"GGPO_NOTIFY_{k.upper()}": v for k, v in notify.items()}})


def test_a_transition_writes_its_notification_in_its_own_transaction(ledger) -> None:  # type: ignore[no-untyped-def]
    expected = make_events(ledger, hung=False)
    for observed in ("experiment.finished.fin-v1", "experiment.finished.nt-v1"):
        expected.pop(observed)  # seen by reconcile, not a transition
    outbox = _outbox(ledger)
    _match(expected, outbox)
    failed = next(n for n in outbox if n.kind == kinds.RUN_FAILED and "nt-v1-1" in n.dedupe_key)
    assert failed.subject == "run nt-v1-1-clean failed: exit code 1" and failed.next_try_at is not None
    assert failed.fields["reason"] == "exit code 1" and failed.fields["actor"] == "w"
    assert failed.key.startswith(failed.dedupe_key + ".") and len(failed.key) > len(failed.dedupe_key) + 8
    decision = next(n for n in outbox if n.kind == kinds.COST_DECISION)
    assert "big: not_reproduced_high_cost by carol, 5000.0 GPU-h estimated (cap 100.0)" in decision.subject

    # The outbox insert is part of the transition: when it cannot be written, the run does not move.
    [key] = _experiment(ledger, "atomic", range(1, 2))
    _ran(ledger, key)
    ledger.retry_seconds = 0
    with ledger.engine.begin() as conn:
        conn.execute(text("ALTER TABLE notifications RENAME TO notifications_away"))
    try:
        with pytest.raises(Exception, match="notifications"):
            ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason="oom")
    finally:
        with ledger.engine.begin() as conn:
            conn.execute(text("ALTER TABLE notifications_away RENAME TO notifications"))
    run = ledger.get_run(key)
    assert run.state == "running" and run.attempts[0].state == "running"
    assert not [e for e in ledger.events(run_key=key) if e.to_state == "failed"]
    ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason="oom")
    assert len([n for n in _outbox(ledger) if key in n.dedupe_key]) == 1


def test_reconcile_records_what_it_observes_once(ledger, db_url: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    expected = make_events(ledger, hung=True)
    # An experiment that finished before the outbox could tell anyone: recorded, not sent.
    [old] = _experiment(ledger, "old", range(1, 2))
    _ran(ledger, old)
    ledger.mark_finished(old, 1, attempt_state="succeeded", run_state="succeeded", actor="w")
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET updated_at = :t WHERE run_key = :k"),
                     {"t": utcnow() - timedelta(days=3), "k": old})
    settings = _settings(db_url, tmp_path)
    for _ in range(3):  # each pass sees the same events: they are recorded once
        observe(ledger, settings)
    outbox = _outbox(ledger)
    told_already = [n for n in outbox if n.dedupe_key == "experiment.finished.old-v1"]
    assert len(told_already) == 1 and told_already[0].next_try_at is None
    _match(expected, [n for n in outbox if n not in told_already])
    fin = next(n for n in outbox if n.dedupe_key == "experiment.finished.fin-v1")
    assert fin.subject.startswith("fin v1 finished: 2 runs (1 failed, 1 succeeded), ") and "GPU-h" in fin.subject
    assert fin.fields["states"] == {"failed": 1, "succeeded": 1}
    hung = next(n for n in outbox if n.kind == kinds.RUN_HUNG)
    assert hung.fields["silent_seconds"] > 7000 and "before its first heartbeat" in hung.subject

    # Nightly: a metric moved since the last night that ran, and a scheduled night (02:30 UTC) with no run.
    noon = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    day = noon.date()
    assert ledger.record_notices(nightly(ledger, noon)) == 0  # no nightly tier in this ledger: nothing missed
    _night(ledger, (day - timedelta(days=3)).isoformat(), 1.0)
    _night(ledger, (day - timedelta(days=1)).isoformat(), 1.5)
    for _ in range(2):
        notices = nightly(ledger, noon)
        ledger.record_notices(notices)
    assert sorted(n.dedupe_key for n in notices) == [f"nightly.missed.ggpo.{day}",
                                                      f"nightly.moved.ggpo.{day - timedelta(days=1)}"]
    moved = next(n for n in notices if n.kind == kinds.NIGHTLY_MOVED)
    assert "final_test_nll" in moved.subject and moved.fields["compared_with"] == str(day - timedelta(days=3))
    # Before the night's grace has passed, it is not missed yet.
    early = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(hours=2, minutes=31) + NIGHT_GRACE / 2
    assert not [n for n in nightly(ledger, early) if n.kind == kinds.NIGHTLY_MISSED and str(day) in n.dedupe_key]
    assert len([n for n in _outbox(ledger) if n.kind.startswith("nightly")]) == 2


def _notify(http_port: int, smtp_port: int, **more: str) -> dict[str, str]:
    return {"webhook_urls": f"http://127.0.0.1:{http_port}/hook", "smtp_host": "127.0.0.1",
            "smtp_port": str(smtp_port), "email_to": "ml-team@example.org", "email_from": "batch@example.org",
            "timeout_seconds": str(TIMEOUT), "retry_seconds": "3", **more}


def _sleep_out_backoff(led: Any) -> None:
    """Wait until every delivery that failed is due again."""
    due = max(d.next_try_at for _, ds in led.notifications(undelivered=False) for d in ds.values()
              if d.next_try_at is not None)
    time.sleep(max(0.0, (due - utcnow()).total_seconds()) + 0.1)


def _pass(settings: Any) -> float:
    t0 = time.monotonic()
    reconcile_now(settings, [], actor="reconcile@test")  # what a worker's maintenance runs
    return time.monotonic() - t0


@pytest.mark.slow
def test_every_event_arrives_once_keyed_through_dead_and_hanging_sinks(  # type: ignore[no-untyped-def]
        ledger, env: dict[str, str], db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = make_events(ledger, hung=False)
    http_port, smtp_port = free_port(), free_port()
    notify = _notify(http_port, smtp_port)
    settings = _settings(db_url, tmp_path, **notify)
    for k, v in notify.items():
        monkeypatch.setenv(f"GGPO_NOTIFY_{k.upper()}", v)
    web, mail = Received(), Received()

    # Phase 1: the webhook refuses connections, the SMTP server accepts them and never answers.
    hole = BlackHole(smtp_port)
    with stopping(hole):
        took = _pass(settings)
        assert len(hole.accepted) == 1, "the hanging sink is tried once a pass, not once per notice"
        _pass(settings)
        assert len(hole.accepted) == 1, "a sink in back-off is left alone"
        # The hanging sink held the pass for its timeout, not more: measured by the sink (the client
        # closed its connection then). The pass's own wall time only bounds a hang: on a saturated
        # machine its other work took 3.5 s, and a bound of the timeout + 2 s failed.
        [held] = wait_until(lambda: hole.held, 10, "the client to close its connection to the hanging sink")
        assert held < TIMEOUT + 1.0 and took < TIMEOUT + 30, (held, took)
        view = json.loads(CliRunner().invoke(cli, ["notifications", "--json"], catch_exceptions=False).output)
    sinks = {s["name"].split(":")[0]: s for s in view["sinks"]}
    assert sinks["webhook"]["retrying"] == 1 and "refused" in sinks["webhook"]["last_error"]
    assert sinks["email"]["retrying"] == 1 and "timed out" in sinks["email"]["last_error"]
    assert view["counts"]["pending"] == len(expected) and len(view["notifications"]) == len(expected)
    shown = CliRunner().invoke(cli, ["notifications"], catch_exceptions=False).output
    assert "timed out" in shown and f"{len(expected)} notification(s) pending" in shown

    # Phase 2: the webhook takes the notice but answers after the sender gave up (it will come again,
    # with the same key); the SMTP server is gone (connection refused).
    _sleep_out_backoff(ledger)
    slow = HttpReceiver(http_port, web, delay=3 * TIMEOUT)
    with stopping(slow):
        _pass(settings)
        assert len(web.items) == 1
    _sleep_out_backoff(ledger)

    # Phase 3: both up. Every notice arrives; the one the slow receiver got arrives again, same key.
    http, smtp = HttpReceiver(http_port, web), SmtpReceiver(smtp_port, mail)
    with stopping(http, smtp):
        deadline = time.monotonic() + 30
        while ledger.notification_counts()["pending"] and time.monotonic() < deadline:
            _pass(settings)
            time.sleep(0.3)
    outbox = _outbox(ledger)
    _match(expected, outbox)  # each event recorded once
    keys = {n.key for n in outbox}
    assert set(web.keys) == keys and set(mail.keys) == keys
    assert len(web.keys) == len(keys) + 1 and web.keys.count(web.keys[0]) == 2  # at least once: the retry
    assert len(mail.keys) == len(keys)
    assert all(d.state == "delivered" for _, ds in ledger.notifications(undelivered=False) for d in ds.values())
    assert ledger.notification_counts() == {"pending": 0, "failed_deliveries": 0}
    body = next(doc for key, doc in web.items if doc["text"].startswith("fin v1"))
    assert body["schema"] == 1 and body["text"].startswith("fin v1 finished") and body["fields"]["version"] == 1
    mailed = next(doc for key, doc in mail.items if "nt-v1-1-clean failed" in doc["subject"])
    assert mailed["to"] == ["ml-team@example.org"] and "exit code 1" in mailed["body"]
    assert not CliRunner().invoke(cli, ["notifications", "--json"]).output.count('"key"')  # nothing left to show


def test_a_dead_sink_costs_a_pass_one_timeout_and_a_transition_nothing(  # type: ignore[no-untyped-def]
        ledger, db_url: str, tmp_path: Path) -> None:
    http_port, smtp_port = free_port(), free_port()
    web_hole, mail_hole = BlackHole(http_port), BlackHole(smtp_port)
    dead = _settings(db_url, tmp_path, **_notify(http_port, smtp_port, retry_seconds="60"))
    one_dead = _settings(db_url, tmp_path, webhook_urls=f"http://127.0.0.1:{http_port}/other", timeout_seconds=str(TIMEOUT))
    with stopping(web_hole, mail_hole):
        keys = _experiment(ledger, "slowsink", range(1, 11))
        for key in keys:
            _ran(ledger, key)
        t0 = time.monotonic()
        for key in keys:  # failures: each writes a notification
            ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason="x")
        per_transition = (time.monotonic() - t0) / len(keys)
        assert not web_hole.accepted and not mail_hole.accepted, "a transition never contacts a sink"
        assert per_transition < TIMEOUT, per_transition
        took = _pass(dead)
        assert len(web_hole.accepted) == 1 and len(mail_hole.accepted) == 1
        # One connection a sink (above) is what a per-pass breaker buys; the times only bound the pass
        # (one timeout a sink, with room for a loaded machine: 10 notices a timeout each would be 10 s).
        assert took < 2 * TIMEOUT + 3.0, f"a pass with two hanging sinks took {took:.2f} s"
        _pass(dead)
        assert len(web_hole.accepted) == 1 and len(mail_hole.accepted) == 1, "sinks in back-off are left alone"
        # One hanging sink alone (another URL: not in back-off yet) is tried once in a pass, not once a notice.
        took = _pass(one_dead)
        assert len(web_hole.accepted) == 2 and took < TIMEOUT + 3.0, took
    assert backoff(1, 60).total_seconds() == 60 and backoff(3, 60).total_seconds() == 240
    assert backoff(20, 60).total_seconds() == 3600


def test_the_finished_headline_is_the_reports_main_figures(ledger) -> None:  # type: ignore[no-untyped-def]
    """Runs by state, GPU-hours, and the three best arms' reward minus the baseline's (paired by
    seed, 95 % interval), as the report computes them; a warning counted."""
    from ggpo_batch.reporting.headline import headline
    from ggpo_batch.reporting.report import experiment_report
    from tests.test_report_outcomes import build

    build(ledger, "four", fail=("paired", 2))
    assert headline(experiment_report(ledger, "four")) == (
        "four v1 finished: 15 runs (14 succeeded, 1 failed), 0.283 GPU-h; eval_reward vs clean: "
        "paired_answer +0.217 [+0.165, +0.268], random_answer +0.130 [+0.000, +0.260], paired +0.120 [-0.007, +0.247]; "
        "1 comparability warning(s) in its report")
