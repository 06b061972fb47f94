from __future__ import annotations

import pytest

from ggpo_batch.errors import LedgerError
from ggpo_batch.ledger import NewRun


def _experiment(ledger, n: int = 2, retries: int = 0):  # type: ignore[no-untyped-def]
    runs = [NewRun(run_key=f"e-v1-{i}-clean", arm="clean", seed=i, config_hash="h", run_spec={"seed": i},
                   retries_allowed=retries) for i in range(n)]
    return ledger.create_experiment(name="e", version=1, method="ggpo", source="spec", spec_hash="x", spec={},
                                    gpus=4, actor="alice", runs=runs, queue="q")


def test_lifecycle_appends_one_event_per_transition(ledger) -> None:  # type: ignore[no-untyped-def]
    _experiment(ledger)
    att = ledger.begin_attempt("e-v1-0-clean", executor="debug", gpus=4, actor="w", worker="w1")
    assert att.number == 1 and att.state == "submitting"
    assert ledger.in_flight_gpus("q") == 4
    ledger.mark_submitted("e-v1-0-clean", 1, job_id="123", actor="w")
    ledger.mark_running("e-v1-0-clean", 1, actor="w")
    ledger.mark_finished("e-v1-0-clean", 1, attempt_state="succeeded", run_state="succeeded", actor="w",
                         elapsed_seconds=900.0, gpu_hours_job=1.0, gpu_hours_scheduler=1.0)
    run = ledger.get_run("e-v1-0-clean")
    assert run.state == "succeeded" and run.worker is None
    assert ledger.in_flight_gpus("q") == 0
    moves = [(e.entity, e.from_state, e.to_state) for e in ledger.events(run_key="e-v1-0-clean")]
    assert moves == [
        ("run", None, "queued"),
        ("attempt", None, "submitting"),
        ("attempt", "submitting", "submitted"),
        ("run", "queued", "submitted"),
        ("attempt", "submitted", "running"),
        ("run", "submitted", "running"),
        ("attempt", "running", "succeeded"),
        ("run", "running", "succeeded"),
    ]


def test_illegal_moves_are_refused(ledger) -> None:  # type: ignore[no-untyped-def]
    _experiment(ledger)
    key = "e-v1-0-clean"
    with pytest.raises(LedgerError, match="has no attempt 1"):
        ledger.mark_running(key, 1, actor="w")
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker=None)
    # The run is still queued (no job id yet): it cannot jump to succeeded, and nothing is written.
    with pytest.raises(LedgerError, match="cannot go from queued to succeeded"):
        ledger.mark_finished(key, 1, attempt_state="succeeded", run_state="succeeded", actor="w")
    assert ledger.get_run(key).attempts[0].state == "submitting"
    ledger.mark_submitted(key, 1, job_id="1", actor="w")
    ledger.mark_finished(key, 1, attempt_state="failed", run_state="failed", actor="w", reason="boom")
    assert ledger.get_run(key).cause == "boom"
    with pytest.raises(LedgerError, match="needs a reason"):
        ledger.requeue(key, actor="bob", reason="")
    with pytest.raises(LedgerError, match="only a queued run"):
        ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker=None)
    with pytest.raises(LedgerError, match="already ended"):
        ledger.mark_finished(key, 1, attempt_state="failed", run_state=None, actor="w")
    with pytest.raises(LedgerError, match="no run"):
        ledger.get_run("nope")


def test_retry_by_hand_is_a_new_attempt_with_who_and_why(ledger) -> None:  # type: ignore[no-untyped-def]
    _experiment(ledger)
    key = "e-v1-1-clean"
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker=None)
    ledger.mark_submitted(key, 1, job_id="1", actor="w")
    ledger.mark_finished(key, 1, attempt_state="node_fail", run_state="failed", actor="w", reason="NODE_FAIL",
                         gpu_hours_scheduler=0.25)
    ledger.requeue(key, actor="bob", reason="node n3 replaced")
    att2 = ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker=None)
    assert att2.number == 2
    ledger.mark_submitted(key, 2, job_id="2", actor="w")
    ledger.mark_finished(key, 2, attempt_state="succeeded", run_state="succeeded", actor="w", gpu_hours_job=1.0)
    run = [r for r in ledger.runs() if r.run_key == key][0]
    assert [a.state for a in run.attempts] == ["node_fail", "succeeded"]
    assert [a.gpu_hours_scheduler or a.gpu_hours_job for a in run.attempts] == [0.25, 1.0]
    retry = [e for e in ledger.events(run_key=key) if e.from_state == "failed"][0]
    assert (retry.actor, retry.reason, retry.to_state) == ("bob", "node n3 replaced", "queued")


def test_submitting_attempt_is_fenced_until_resolved(ledger) -> None:  # type: ignore[no-untyped-def]
    """A worker killed between begin_attempt and mark_submitted: nobody else may submit the run
    until reconcile has asked the scheduler (found -> submitted, not found -> lost)."""
    _experiment(ledger)
    ledger.begin_attempt("e-v1-0-clean", executor="slurm", gpus=4, actor="w", worker="w1")
    with pytest.raises(LedgerError, match="being submitted by w1"):
        ledger.begin_attempt("e-v1-0-clean", executor="slurm", gpus=4, actor="w", worker="w2")
    ledger.resolve_submitting("e-v1-0-clean", 1, job_id="77", actor="reconcile", reason="found by name")
    assert ledger.get_run("e-v1-0-clean").state == "submitted"
    ledger.mark_submitted("e-v1-0-clean", 1, job_id="77", actor="w")  # reported twice: harmless
    with pytest.raises(LedgerError, match="with job 77"):
        ledger.mark_submitted("e-v1-0-clean", 1, job_id="78", actor="w")
    ledger.begin_attempt("e-v1-1-clean", executor="slurm", gpus=4, actor="w", worker="w1")
    ledger.resolve_submitting("e-v1-1-clean", 1, job_id=None, actor="reconcile", reason="worker died before sbatch")
    run = ledger.get_run("e-v1-1-clean")
    assert run.state == "lost" and run.attempts[0].state == "lost" and run.attempts[0].gpu_hours_job == 0.0


def test_quota_is_checked_atomically(ledger) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.ledger import QuotaExceeded

    _experiment(ledger, n=3)
    ledger.begin_attempt("e-v1-0-clean", executor="debug", gpus=4, actor="w", worker=None, quota=("q", 8))
    ledger.begin_attempt("e-v1-1-clean", executor="debug", gpus=4, actor="w", worker=None, quota=("q", 8))
    with pytest.raises(QuotaExceeded, match="8 GPUs in flight"):
        ledger.begin_attempt("e-v1-2-clean", executor="debug", gpus=4, actor="w", worker=None, quota=("q", 8))
    assert ledger.get_run("e-v1-2-clean").attempts == []
    assert ledger.in_flight_gpus("q") == 8 and ledger.in_flight_gpus("other") == 0


def test_decisions_artifacts_and_night_guard(ledger) -> None:  # type: ignore[no-untyped-def]
    d = ledger.record_decision(experiment_name="big", kind="not_reproduced_high_cost", actor="carol",
                               estimated_gpu_hours=3000.0, cap_gpu_hours=64.0, cost_basis="8000 updates",
                               cost_type="paper-reported", review_done=True, automatic_retry=False,
                               resolution="too expensive, not reproduced")
    assert d.id and ledger.decisions("big")[0].review_done is True
    first = ledger.claim_night(method="ggpo", tier="l1_mechanism", night="2026-12-02", actor="cron")
    again = ledger.claim_night(method="ggpo", tier="l1_mechanism", night="2026-12-02", actor="cron2")
    assert first is not None and again is None
    ledger.finish_component_run(first.id, state="succeeded", record={"a": 1}, seconds=12.5, commit="abc",
                                dirty=False)
    ledger.record_artifact(path="/x.json", sha256="0" * 64, size_bytes=10, kind="component_record",
                           component_run_id=first.id)
    assert [c.state for c in ledger.component_runs()] == ["succeeded"]
    assert ledger.artifacts(component_run_id=first.id)[0].path == "/x.json"


def test_settle_attempt_books_a_debug_job_submitted_and_ended_in_one_transaction(ledger) -> None:  # type: ignore[no-untyped-def]
    """The worker's path for a job that ended inside submit(): the same rows and events as
    mark_submitted then mark_finished, decided on the run as the transaction locked it."""
    _experiment(ledger)
    key = "e-v1-0-clean"
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker="w1")
    seen = []

    def conclude(run, att):  # type: ignore[no-untyped-def]
        seen.append((run.state, att.state, att.job_id, [a.number for a in run.attempts]))
        return {"attempt_state": "failed", "run_state": "failed", "reason": "boom", "exit_code": "1",
                "elapsed_seconds": 2.0, "gpu_hours_job": 0.5}

    run, att = ledger.settle_attempt(key, 1, conclude, actor="w", job_id="debug-1")
    assert seen == [("submitted", "submitted", "debug-1", [1])]
    assert (run.state, att.state) == ("failed", "failed")
    stored = ledger.get_run(key)
    [a] = stored.attempts
    assert (stored.state, stored.cause, stored.worker) == ("failed", "boom", None)
    assert (a.state, a.job_id, a.exit_code, a.gpu_hours_job, a.reason) == ("failed", "debug-1", "1", 0.5, "boom")
    assert a.submitted_at is not None and a.ended_at is not None
    moves = [(e.entity, e.from_state, e.to_state, e.actor) for e in ledger.events(run_key=key)]
    assert moves[1:] == [
        ("attempt", None, "submitting", "w"),
        ("attempt", "submitting", "submitted", "w"),
        ("run", "queued", "submitted", "w"),
        ("attempt", "submitted", "failed", "w"),
        ("run", "submitted", "failed", "w"),
    ]
    assert all(e.attempt_id == a.id for e in ledger.events(run_key=key)[1:])


def test_settle_attempt_after_reconcile_settled_it_writes_nothing(ledger) -> None:  # type: ignore[no-untyped-def]
    """The fence's second half: an attempt settled as lost meanwhile is not booked as submitted."""
    _experiment(ledger)
    key = "e-v1-0-clean"
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker="w1")
    ledger.resolve_submitting(key, 1, job_id=None, actor="reconcile", reason="worker gone")
    before = len(ledger.events(run_key=key))
    with pytest.raises(LedgerError, match="is lost"):
        ledger.settle_attempt(key, 1, lambda run, att: {"attempt_state": "failed", "run_state": "failed"},
                              actor="w", job_id="debug-1")
    [a] = ledger.get_run(key).attempts
    assert (a.state, a.job_id) == ("lost", None) and len(ledger.events(run_key=key)) == before


def test_begin_submission_reads_the_run_and_begins_its_attempt_in_one_transaction(ledger) -> None:  # type: ignore[no-untyped-def]
    """The worker's first step: the run's spec and queue as the transaction locked them, the
    attempt begun as `plan` says (quota included); a run that is not queued is left untouched."""
    from ggpo_batch.ledger import QuotaExceeded
    from ggpo_batch.ledger.submissions import AttemptPlan

    _experiment(ledger, n=3)
    seen = []

    def plan(run_spec, queue):  # type: ignore[no-untyped-def]
        seen.append((run_spec, queue))
        return AttemptPlan("debug", 4, ("q", 4))

    took = ledger.begin_submission("e-v1-0-clean", actor="w", worker="w1", plan=plan)
    assert seen == [({"seed": 0}, "q")]
    assert (took.state, took.run_spec, took.queue, took.attempt.number) == ("queued", {"seed": 0}, "q", 1)
    [a] = ledger.get_run("e-v1-0-clean").attempts
    assert (a.id, a.state, a.executor, a.gpus, a.worker) == (took.attempt.id, "submitting", "debug", 4, "w1")
    assert ledger.get_run("e-v1-0-clean").worker == "w1"
    assert [(e.entity, e.to_state, e.attempt_id) for e in ledger.events(run_key="e-v1-0-clean")][1:] == [
        ("attempt", "submitting", a.id)]

    with pytest.raises(QuotaExceeded, match="4 GPUs in flight"):  # the first attempt holds the quota's 4 GPUs
        ledger.begin_submission("e-v1-1-clean", actor="w", worker="w1", plan=plan)
    assert ledger.get_run("e-v1-1-clean").attempts == []

    ledger.mark_cancelled("e-v1-2-clean", actor="alice", reason="not wanted")
    events = len(ledger.events(run_key="e-v1-2-clean"))
    took = ledger.begin_submission("e-v1-2-clean", actor="w", worker="w1", plan=plan)
    assert (took.state, took.attempt) == ("cancelled", None) and len(seen) == 2  # plan not asked
    assert ledger.get_run("e-v1-2-clean").attempts == [] and len(ledger.events(run_key="e-v1-2-clean")) == events
    with pytest.raises(LedgerError, match="no run"):
        ledger.begin_submission("nope", actor="w", worker="w1", plan=plan)


def test_begin_submission_follows_the_latest_attempt(ledger) -> None:  # type: ignore[no-untyped-def]
    """The run and its latest attempt come from one query: the next attempt is numbered after the
    latest of several, and one still being submitted keeps the run from a second worker."""
    from ggpo_batch.ledger.submissions import AttemptPlan

    _experiment(ledger, n=1)
    key = "e-v1-0-clean"

    def plan(run_spec, queue):  # type: ignore[no-untyped-def]
        return AttemptPlan("debug", 4)

    for number in (1, 2, 3):
        took = ledger.begin_submission(key, actor="w", worker="w1", plan=plan)
        assert took.attempt.number == number
        with pytest.raises(LedgerError, match=f"attempt {number} is being submitted by w1"):
            ledger.begin_submission(key, actor="w", worker="w2", plan=plan)
        ledger.settle_attempt(key, number, lambda run, att: {"attempt_state": "failed", "run_state": "failed"},
                              actor="w", job_id=f"debug-{number}")
        ledger.requeue(key, actor="alice", reason="again")
    run = ledger.get_run(key)
    assert [(a.number, a.state, a.job_id) for a in run.attempts] == [
        (1, "failed", "debug-1"), (2, "failed", "debug-2"), (3, "failed", "debug-3")]
    assert ledger.attempt_state(key, 2) == "failed" and ledger.attempt_state(key, 4) is None


def _round_trips(ledger, work) -> int:  # type: ignore[no-untyped-def]
    """How many times `work()` waited for PostgreSQL: the Sync and simple Query messages that libpq's
    trace of the pool's one connection shows the client sending."""
    import tempfile

    import psycopg

    assert ledger.engine.pool.checkedin() <= 1  # the trace follows one connection: work must use it
    with tempfile.TemporaryFile("w+") as trace:
        with ledger.engine.connect() as conn:
            pgconn = conn.connection.dbapi_connection.pgconn
            pgconn.trace(trace.fileno())
            pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        sent = [line.split("\t") for line in trace if line.startswith("F\t")]
    return sum(1 for fields in sent if fields[2].startswith(("Sync", "Query")))


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_worker_job_waits_ten_times_for_postgresql(ledger, db_url) -> None:  # type: ignore[no-untyped-def]
    """A debug run's ledger work in a worker: begin (BEGIN, the run with its last attempt, the new
    attempt; its event and the run's worker sent with the COMMIT), the fence (one autocommit read)
    and the end (BEGIN, the run with its attempts; the two updates and the events sent with the
    COMMIT). Each wait is a wake-up of the server, and on a remote ledger a network round trip.
    Counted on the ledger as a worker opens it: no pre-ping when a connection leaves the pool."""
    from ggpo_batch.ledger import connect
    from ggpo_batch.ledger.submissions import AttemptPlan

    _experiment(ledger, n=1)
    key = "e-v1-0-clean"
    end = {"attempt_state": "failed", "run_state": "failed", "reason": "boom", "exit_code": "1"}
    worker_ledger = connect(db_url, pre_ping=False)

    def job() -> None:
        att = worker_ledger.begin_submission(key, actor="w", worker="w1", plan=lambda _s, _q: AttemptPlan("debug", 4))
        assert worker_ledger.attempt_state(key, att.attempt.number) == "submitting"
        worker_ledger.settle_attempt(key, att.attempt.number, lambda _r, _a: end, actor="w", job_id="debug-1")

    try:
        assert _round_trips(worker_ledger, job) == 10
    finally:
        worker_ledger.engine.dispose()
    [a] = ledger.get_run(key).attempts
    assert (a.state, a.job_id, a.exit_code) == ("failed", "debug-1", "1")
    assert [e.to_state for e in ledger.events(run_key=key)][1:] == [
        "submitting", "submitted", "submitted", "failed", "failed"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_write_refused_in_the_tail_sent_with_the_commit_keeps_nothing(ledger) -> None:  # type: ignore[no-untyped-def]
    """The last writes of a transition travel with its COMMIT without waiting for their replies: one
    the server refuses (an exit code longer than its column) is raised at the commit, and the whole
    transition is rolled back, as if it had been raised at its own statement. The connection stays
    usable for the next transition."""
    from sqlalchemy.exc import DataError

    _experiment(ledger, n=1)
    key = "e-v1-0-clean"
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker="w1")
    events = len(ledger.events(run_key=key))
    too_long = {"attempt_state": "failed", "run_state": "failed", "reason": "boom", "exit_code": "9" * 40}
    with pytest.raises(DataError, match="too long"):
        ledger.settle_attempt(key, 1, lambda _r, _a: too_long, actor="w", job_id="debug-1")
    [a] = ledger.get_run(key).attempts
    assert (a.state, a.job_id, ledger.get_run(key).state) == ("submitting", None, "queued")
    assert len(ledger.events(run_key=key)) == events
    run, att = ledger.settle_attempt(key, 1, lambda _r, _a: {**too_long, "exit_code": "9"}, actor="w",
                                     job_id="debug-1")
    assert (att.state, att.exit_code, run.state) == ("failed", "9", "failed")


def _skip_updates_of(ledger, table: str) -> None:  # type: ignore[no-untyped-def]
    """A trigger that makes every UPDATE of `table` change nothing, silently: what row-level security
    does to an UPDATE it does not allow (SQLite has no row-level security; a trigger that ignores the
    row has the same effect on both backends)."""
    from sqlalchemy import text

    with ledger.engine.begin() as conn:
        if ledger.engine.dialect.name == "sqlite":
            conn.execute(text(f"CREATE TRIGGER skip_{table} BEFORE UPDATE ON {table} BEGIN SELECT RAISE(IGNORE); END"))
        else:
            conn.execute(text("CREATE OR REPLACE FUNCTION skip_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; "
                              "END $$"))
            conn.execute(text(f"CREATE TRIGGER skip_{table} BEFORE UPDATE ON {table} FOR EACH ROW "
                              "EXECUTE FUNCTION skip_row()"))


def test_a_transition_whose_update_changes_no_row_is_refused_and_writes_nothing(ledger) -> None:  # type: ignore[no-untyped-def]
    """An UPDATE that changes no row (row-level security filters what it does not allow, silently) is
    refused (exit 6), never reported as done: the worker's row-level transitions (their UPDATEs sent
    with the COMMIT on PostgreSQL, checked by the database), the ORM's (a session), and a decision's
    Core update. Nothing of the refused transition is written: no event, no state."""
    from ggpo_batch.errors import NotPermitted

    _experiment(ledger, n=2)
    key = "e-v1-0-clean"
    ledger.begin_attempt(key, executor="debug", gpus=4, actor="w", worker="w1")
    _skip_updates_of(ledger, "attempts")
    events = len(ledger.events(run_key=key))
    with pytest.raises(NotPermitted, match=f"attempt 1 of run {key}"):
        ledger.mark_submitted(key, 1, job_id="7", actor="w")  # row-level: attempts and run, pipelined on PG
    with pytest.raises(NotPermitted, match="changed no row"):
        ledger.resolve_submitting(key, 1, job_id=None, actor="r", reason="worker died")  # ORM session
    run = ledger.get_run(key)
    assert (run.state, run.attempts[0].state, run.attempts[0].job_id) == ("queued", "submitting", None)
    assert len(ledger.events(run_key=key)) == events
    _skip_updates_of(ledger, "runs")
    other = "e-v1-1-clean"
    with pytest.raises(NotPermitted, match=f"beginning run {other}"):
        ledger.begin_attempt(other, executor="debug", gpus=4, actor="w", worker="w1")
    with pytest.raises(NotPermitted, match="changed no row"):
        ledger.mark_cancelled(other, actor="alice", reason="not wanted")
    decided = NewRun(run_key="d-v1-1-clean", arm="clean", seed=1, config_hash="h", run_spec={})
    with pytest.raises(NotPermitted, match="deciding the runs of d"):
        ledger.apply_decision(experiment_name="d", kind="not_reproduced_high_cost", actor="alice",
                              fields={"reason": "too costly"}, new_runs=[decided],
                              new_experiment={"name": "d", "version": 1, "method": "ggpo", "source": "spec",
                                              "spec_hash": "y", "spec": {}, "gpus": 4})
    run = ledger.get_run(other)
    assert (run.state, run.attempts) == ("queued", [])
    assert [e.name for e in ledger.experiments()] == ["e"] and ledger.decisions() == []
    assert [len(ledger.events(run_key=k)) for k in (key, other)] == [events, 1]
