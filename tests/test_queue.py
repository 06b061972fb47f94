"""Enqueue, quota deferral, cancel and reconcile against the real Redis and both ledgers."""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from pathlib import Path

import pytest

from ggpo_batch.control.enqueue import enqueue_spec
from ggpo_batch.control.interventions import cancel_runs, retry_run
from ggpo_batch.control.queue import RunQueue
from ggpo_batch.control.reconcile import reconcile
from ggpo_batch.errors import LedgerError, SpecError
from ggpo_batch.spec.parse import load_spec

pytestmark = pytest.mark.redis

SPEC = """
schema = 1
[experiment]
name = "q"
method = "ggpo"
seeds = [1, 2]
gpus = 4
loop_budget_seconds = 2
executor = "local"
[overheads]
setup_export_seconds = 1
audit_seconds = 1
evaluation_seconds = 1
[arms.clean]
exposure = "none"
[arms.paired]
exposure = "paired"
exposed_items = 2
templates = ["train_direct", "train_role"]
"""


def _spec(tmp_path: Path, text: str = SPEC):  # type: ignore[no-untyped-def]
    p = tmp_path / "q.toml"
    p.write_text(text)
    return load_spec(p)


def test_enqueue_is_idempotent_and_refuses_a_changed_spec(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    res = enqueue_spec(ledger, settings, spec, actor="tester")
    assert res.enqueued == 4 and res.version == 1
    expected = {r.run_key: (r.config_hash, r.to_dict()) for r in spec.expand(1)}  # one to_dict per run serves both
    assert {r.run_key: (r.config_hash, r.run_spec) for r in ledger.runs()} == expected
    q = RunQueue.from_url(settings.redis_url, "testq")
    assert sorted(q.waiting()) == sorted(r.run_key for r in spec.expand(1))
    again = enqueue_spec(ledger, settings, spec, actor="tester")
    assert again.enqueued == 0 and again.new_runs == []
    assert len(q.queue.get_job_ids()) == 4 and len(ledger.runs()) == 4
    changed = _spec(tmp_path, SPEC.replace("seeds = [1, 2]", "seeds = [1, 2, 3]"))
    with pytest.raises(SpecError, match=r"different spec \(seeds: \[1, 2\] -> \[1, 2, 3\]\).*--new-version"):
        enqueue_spec(ledger, settings, changed, actor="tester")
    v2 = enqueue_spec(ledger, settings, changed, new_version=True, actor="tester")
    assert v2.version == 2 and v2.enqueued == 6
    assert [(e.name, e.version) for e in ledger.experiments()] == [("q", 1), ("q", 2)]


def test_subset_then_rest_and_dry_run(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    spec = _spec(tmp_path)
    dry = enqueue_spec(ledger, settings, spec, dry_run=True, actor="tester")
    assert dry.dry_run and len(dry.runs) == 4 and dry.estimate is not None
    assert dry.estimate.total_gpu_hours == pytest.approx(4 * 4 * (2 + 3) / 3600)
    assert ledger.experiments() == [] and RunQueue.from_url(settings.redis_url, "testq").waiting() == {}
    first = enqueue_spec(ledger, settings, spec, arms=["clean"], seeds=[2], actor="tester")
    assert first.new_runs == ["q-v1-2-clean"]
    rest = enqueue_spec(ledger, settings, spec, actor="tester")
    assert sorted(rest.new_runs) == ["q-v1-1-clean", "q-v1-1-paired", "q-v1-2-paired"]
    assert len(ledger.runs()) == 4


def test_quota_defers_without_an_attempt(ledger, settings, worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.control.worker import submit_run

    settings = dataclasses.replace(settings, queue_gpu_quota=4)
    spec = _spec(tmp_path)
    enqueue_spec(ledger, settings, spec, actor="tester")
    # One run already holds the queue's 4 GPUs.
    ledger.begin_attempt("q-v1-1-clean", executor="local", gpus=4, actor="other", worker="elsewhere")
    out = submit_run(ledger, settings, "q-v1-1-paired", worker="w-test")
    assert "quota 4" in out["deferred"]
    run = ledger.get_run("q-v1-1-paired")
    assert run.state == "queued" and run.attempts == []
    events = ledger.events(run_key="q-v1-1-paired")
    assert events[-1].from_state == events[-1].to_state == "queued" and "deferred 1 s" in events[-1].reason
    q = RunQueue.from_url(settings.redis_url, "testq")
    assert "q-v1-1-paired" in q.scheduled()


def test_cancel_queued_run_removes_its_job(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    enqueue_spec(ledger, settings, _spec(tmp_path), actor="tester")
    q = RunQueue.from_url(settings.redis_url, "testq")
    [res] = cancel_runs(ledger, settings, ["q-v1-2-paired"], actor="bob", reason="wrong template")
    assert res.was == "queued" and res.removed_jobs == 1
    assert "q-v1-2-paired" not in q.waiting() and len(q.waiting()) == 3
    run = ledger.get_run("q-v1-2-paired")
    assert run.state == "cancelled" and run.cause == "wrong template"
    # A cancelled run is retried only by hand, with a reason, as a new attempt.
    with pytest.raises(LedgerError, match="needs --reason"):
        retry_run(ledger, settings, "q-v1-2-paired", actor="bob", reason=" ")
    assert retry_run(ledger, settings, "q-v1-2-paired", actor="bob", reason="fixed template") == 1
    assert ledger.get_run("q-v1-2-paired").state == "queued" and "q-v1-2-paired" in q.waiting()


def test_reconcile_after_flushdb_rebuilds_the_queue(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import redis

    enqueue_spec(ledger, settings, _spec(tmp_path), actor="tester")
    q = RunQueue.from_url(settings.redis_url, "testq")
    redis.Redis.from_url(settings.redis_url).flushdb()
    assert q.waiting() == {}
    rep = reconcile(ledger, settings, [q], actor="test")
    assert rep.requeued == 4
    assert sorted(q.waiting()) == sorted(r.run_key for r in ledger.runs())
    again = reconcile(ledger, settings, [q], actor="test")
    assert again.requeued == 0 and len(q.queue.get_job_ids()) == 4


def test_over_cap_is_decided_not_queued_then_accepted(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.errors import CostCapExceeded

    spec = _spec(tmp_path, SPEC.replace('executor = "local"', 'executor = "local"\nmax_gpu_hours = 0.001'))
    q = RunQueue.from_url(settings.redis_url, "testq")
    with pytest.raises(CostCapExceeded, match="nothing queued"):
        enqueue_spec(ledger, settings, spec, actor="carol")
    assert q.waiting() == {}
    assert {r.state for r in ledger.runs()} == {"not_reproduced"} and len(ledger.runs()) == 4
    [d] = ledger.decisions("q")
    assert (d.kind, d.review_done, d.automatic_retry, d.decided_by) == ("not_reproduced_high_cost", False, False,
                                                                       "carol")
    assert d.estimated_gpu_hours == pytest.approx(4 * 4 * 5 / 3600) and d.cap_gpu_hours == 0.001
    res = enqueue_spec(ledger, settings, spec, accept_cost_reason="pilot, approved by PI", actor="carol")
    assert res.enqueued == 4 and sorted(q.waiting()) == sorted(r.run_key for r in ledger.runs())
    assert {r.state for r in ledger.runs()} == {"queued"}
    assert [x.kind for x in ledger.decisions("q")] == ["not_reproduced_high_cost", "cost_accepted"]


def test_status_shows_queue_position_and_the_worker_holding_a_run(ledger, settings, worker_env,  # type: ignore[no-untyped-def]
                                                                  tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from ggpo_batch.cli import cli

    enqueue_spec(ledger, settings, _spec(tmp_path), actor="tester")
    ledger.begin_attempt("q-v1-1-clean", executor="local", gpus=4, actor="tester", worker="host.1234")
    res = CliRunner().invoke(cli, ["status", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = {r["run_key"]: r for r in json.loads(res.output)["experiments"][0]["runs"]}
    positions = sorted(r["queue_position"] for r in rows.values())
    assert positions == [1, 2, 3, 4]
    assert rows["q-v1-1-clean"]["worker"] == "host.1234"
    table = CliRunner().invoke(cli, ["status"], catch_exceptions=False).output
    assert "queue #1" in table and "worker host.1234" in table


def test_runs_reach_redis_only_after_the_ledger_committed_them(ledger, settings, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed ledger write sends nothing to Redis; a good one sends every run, a chunk
    (one pipeline) at a time, in the spec's order."""
    import ggpo_batch.control.queue as queue_module

    spec = _spec(tmp_path)
    q = RunQueue.from_url(settings.redis_url, "testq")

    def refuse(*_args, **_kwargs):  # type: ignore[no-untyped-def]
        raise LedgerError("the ledger is down")

    monkeypatch.setattr(type(ledger), "create_experiment", refuse)
    with pytest.raises(LedgerError, match="down"):
        enqueue_spec(ledger, settings, spec, actor="tester")
    assert q.connection.dbsize() == 0
    monkeypatch.undo()
    monkeypatch.setattr(queue_module, "CHUNK", 3)  # 4 runs: two chunks
    assert enqueue_spec(ledger, settings, spec, actor="tester").enqueued == 4
    assert list(q.waiting()) == [r.run_key for r in spec.expand(1)]

_RQ_TIME = re.compile(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def _redis_contents(conn) -> dict[bytes, object]:  # type: ignore[no-untyped-def]
    """Every key of the database with its type, value and TTL; a job's timestamps only checked
    to be in RQ's format, its data decompressed."""
    out: dict[bytes, object] = {}
    for key in conn.keys("*"):
        kind = conn.type(key)
        if kind == b"hash":
            fields = conn.hgetall(key)
            for stamp in (b"created_at", b"enqueued_at"):
                assert _RQ_TIME.fullmatch(fields.pop(stamp)), (key, stamp)
            fields[b"data"] = json.loads(zlib.decompress(fields[b"data"]))
            value: object = fields
        elif kind == b"list":
            value = conn.lrange(key, 0, -1)
        elif kind == b"set":
            value = conn.smembers(key)
        else:
            value = kind
        out[key] = (kind, value, conn.ttl(key))
    return out


def test_chunk_writes_the_jobs_rq_itself_writes(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The enqueue's chunk writer (RQ writes a chunk's first job; the others are copies of its
    hash) leaves Redis exactly as RQ's own enqueue_many of the same runs does: every key, hash
    field, queue entry in order, and TTL."""
    import ggpo_batch.control.queue as queue_module

    monkeypatch.setattr(queue_module, "CHUNK", 3)  # 8 runs: chunks of 3, 3 and 2
    keys = [f"e-v1-{seed}-arm{arm}" for seed in range(4) for arm in range(2)]
    q = RunQueue.from_url(redis_url, "testq")
    assert q.enqueue(keys) == len(keys)
    written = _redis_contents(q.connection)
    assert q.connection.flushdb()
    with q.connection.pipeline() as pipe:
        q.queue.enqueue_many([q._data(k, k) for k in keys], pipeline=pipe)  # type: ignore[list-item]
        pipe.execute()
    assert written == _redis_contents(q.connection)
    assert list(q.waiting()) == keys


def _named(tmp_path: Path, name: str, priority: str | None = None):  # type: ignore[no-untyped-def]
    text = SPEC.replace('name = "q"', f'name = "{name}"')
    if priority is not None:
        text = text.replace('executor = "local"', f'executor = "local"\npriority = "{priority}"')
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return load_spec(p)


def test_priorities_are_in_the_ledger_and_workers_take_the_highest_first(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Runs enqueued low (the spec says so), normal, then high (--priority) are stored with their
    priority, shown in the order a worker takes them, taken so by the worker's RQ queues (high,
    normal, low), put back on their own priority's queue by reconcile after Redis lost them, and by
    a retry. The priority is no part of the spec's hash: changing it is no new version."""
    import redis
    from rq import Queue

    from ggpo_batch.control.worker import rq_queues

    low, normal = _named(tmp_path, "lo", "low"), _named(tmp_path, "mid")
    assert low.priority == "low" and low.spec_hash == _named(tmp_path, "lo", "high").spec_hash
    for spec, priority in ((low, None), (normal, None), (_named(tmp_path, "hi", "low"), "high")):
        enqueue_spec(ledger, settings, spec, actor="tester", priority=priority)
    stored = {r.run_key.split("-")[0]: r.priority for r in ledger.runs()}
    assert stored == {"lo": "low", "mid": "normal", "hi": "high"}
    q = RunQueue.from_url(settings.redis_url, "testq")
    order = [k.split("-")[0] for k, _ in sorted(q.waiting().items(), key=lambda kv: kv[1])]
    assert order == ["hi"] * 4 + ["mid"] * 4 + ["lo"] * 4
    page = q.positions(["lo-v1-1-clean", "mid-v1-1-clean", "hi-v1-1-clean"])
    assert [page[k]["queue_position"] for k in ("hi-v1-1-clean", "mid-v1-1-clean", "lo-v1-1-clean")] == [1, 5, 9]

    def taken() -> list[str]:
        conn = redis.Redis.from_url(settings.redis_url)
        out = []
        while (got := Queue.dequeue_any(rq_queues(conn, ["testq"]), None, connection=conn)) is not None:
            out.append(got[0].id.split("-")[0])
        return out

    assert taken() == order  # what the worker's dequeue takes, in turn
    assert q.waiting() == {}
    assert reconcile(ledger, settings, [q], actor="test").requeued == 12
    assert [k.split("-")[0] for k, _ in sorted(q.waiting().items(), key=lambda kv: kv[1])] == order
    cancel_runs(ledger, settings, ["hi-v1-1-clean"], actor="tester")
    assert "hi-v1-1-clean" not in q.waiting()
    retry_run(ledger, settings, "hi-v1-1-clean", actor="tester", reason="wanted after all")
    assert q.waiting()["hi-v1-1-clean"] <= 4  # back among the high runs, ahead of every normal one


def test_one_persons_gpu_quota_defers_their_runs_only(ledger, settings, worker_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """GGPO_USER_GPU_QUOTA=4 with 4-GPU runs: with one of alice's runs in flight her next is deferred
    (no attempt; due again on her run's priority queue), while bob's is taken; once hers ended, hers is."""
    from ggpo_batch.control.worker import submit_run
    from ggpo_batch.ledger import QuotaExceeded
    from ggpo_batch.ledger.quotas import UserQuota
    from ggpo_batch.ledger.submissions import AttemptPlan

    settings = dataclasses.replace(settings, user_gpu_quota=4)
    enqueue_spec(ledger, settings, _named(tmp_path, "alices", "high"), actor="alice")
    enqueue_spec(ledger, settings, _named(tmp_path, "bobs"), actor="bob")
    ledger.begin_attempt("alices-v1-1-clean", executor="local", gpus=4, actor="worker", worker="elsewhere")
    out = submit_run(ledger, settings, "alices-v1-1-paired", worker="w-test")
    assert "user alice: 4 GPUs in flight + 4 > quota 4" in out["deferred"]
    assert ledger.get_run("alices-v1-1-paired").attempts == []
    q = RunQueue.from_url(settings.redis_url, "testq")
    from rq.registry import ScheduledJobRegistry

    due = ScheduledJobRegistry("testq:high", connection=q.connection).get_job_ids()
    assert [j.split("-deferred")[0] for j in due] == ["alices-v1-1-paired"]

    def take(key: str):  # type: ignore[no-untyped-def]
        return ledger.begin_submission(key, actor="worker", worker="w",
                                       plan=lambda _s, _q: AttemptPlan("local", 4, None, UserQuota(4)))

    took = take("bobs-v1-1-clean")
    assert took.attempt is not None and took.owner == "bob"
    with pytest.raises(QuotaExceeded, match="user alice"):
        take("alices-v1-1-paired")
    ledger.mark_finished("alices-v1-1-clean", 1, attempt_state="failed", run_state="failed", actor="worker",
                         reason="ended")
    took = take("alices-v1-1-paired")
    assert took.attempt is not None and took.priority == "high"
