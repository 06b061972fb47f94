"""A team on one PostgreSQL ledger: who acted is the database role, and what each may do is decided
by PostgreSQL itself (grants and row-level security of migration 0006), through the CLI and through
direct SQL alike.

The shared PostgreSQL trusts every connection, so these tests run a PostgreSQL of their own (initdb
in a temporary folder, another port, SCRAM password authentication for every role). The ledger is
made as docs/operator.md's "Roles and permissions" says: a non-superuser admin with CREATEROLE owns the
database and runs `db upgrade`, then creates the team and its login roles: alice and bob (members of
team_a), carol (lead of team_a), erin (a member of another team) and worker (the service).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text

from ggpo_batch.cli import cli
from ggpo_batch.common.netutil import free_port
from tests.faults.pgcluster import PrivateCluster
from tests.support.paths import SEED_000
from tests.support.specs import DEBUG_SPEC

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROLES = {"alice": "ggpo_member, team_a", "bob": "ggpo_member, team_a", "carol": "ggpo_lead, team_a",
         "erin": "ggpo_member, team_b", "worker": "ggpo_service"}
TABLES = ("experiments", "runs", "attempts", "events", "decisions", "artifacts", "component_runs", "notifications",
          "notification_deliveries")
# What docs/operator.md's "Roles and permissions" tells the ledger's admin to run, once the ledger exists.
TEAM_SQL = ["CREATE ROLE team_a NOLOGIN IN ROLE ggpo_team", "CREATE ROLE team_b NOLOGIN IN ROLE ggpo_team",
            *(f"CREATE ROLE {r} LOGIN PASSWORD 'pw-{r}-0123' IN ROLE {groups}" for r, groups in ROLES.items())]


@dataclass
class Team:
    cluster: PrivateCluster

    def url(self, role: str) -> str:
        password = "pw-admin-0123" if role == "ledger_admin" else f"pw-{role}-0123"
        return self.cluster.url_of(role, password, "ledger")


@pytest.fixture(scope="module")
def team() -> Iterator[Team]:
    """The private PostgreSQL with the team's ledger; stopped and removed at the end of the module."""
    if shutil.which("runuser") is None and os.geteuid() == 0:
        pytest.skip("running PostgreSQL as root needs runuser")
    from ggpo_batch.ledger import upgrade
    from ggpo_batch.ledger.db import make_engine

    cluster = PrivateCluster(free_port(), password="pw-postgres-0123")
    try:
        cluster.start()
        superuser = create_engine(cluster.url, isolation_level="AUTOCOMMIT")
        with superuser.connect() as conn:
            conn.execute(text("CREATE ROLE ledger_admin LOGIN CREATEROLE PASSWORD 'pw-admin-0123'"))
            conn.execute(text("CREATE DATABASE ledger OWNER ledger_admin"))
        superuser.dispose()
        found = Team(cluster)
        admin = make_engine(found.url("ledger_admin"))
        upgrade(admin)  # as the database's owner, not a superuser: it creates the group roles
        with admin.begin() as conn:
            for statement in TEAM_SQL:
                conn.execute(text(statement))
        admin.dispose()
        yield found
    finally:
        cluster.destroy()


@pytest.fixture
def ledger_of(team: Team, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Empty ledger tables (as the admin) and a way to run the CLI as a role: `run(role, *args, **env)`."""
    admin = create_engine(team.url("ledger_admin"))
    with admin.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE"))
    admin.dispose()
    for key in list(os.environ):
        if key.startswith("GGPO_"):
            monkeypatch.delenv(key)
    spec = tmp_path / "spec.toml"

    def run(role: str, *args: str, **env: str) -> Result:
        values = {"GGPO_DB_URL": team.url(role), "GGPO_REDIS_URL": redis_url, "GGPO_DATA_DIR": str(tmp_path / role),
                  "GGPO_QUEUE": "teamq", **env}
        return CliRunner().invoke(cli, list(args), env=values)

    def enqueue(role: str, name: str, **env: str) -> Result:
        spec.write_text(DEBUG_SPEC.format(name=name))
        return run(role, "enqueue", str(spec), **env)

    run.enqueue = enqueue  # type: ignore[attr-defined]
    run.team = team  # type: ignore[attr-defined]
    return run


def contents(team: Team) -> dict[str, list[str]]:
    """Every row of every ledger table (read by the admin): what a refusal must leave as it was."""
    engine = create_engine(team.url("ledger_admin"))
    with engine.connect() as conn:
        out = {t: sorted(str(tuple(r)) for r in conn.execute(text(f"SELECT * FROM {t}"))) for t in TABLES}
    engine.dispose()
    return out


def scalar(team: Team, sql: str, **params: object) -> object:
    engine = create_engine(team.url("ledger_admin"))
    with engine.connect() as conn:
        value = conn.execute(text(sql), params).scalar()
    engine.dispose()
    return value


def refused(result: Result, *needles: str) -> None:
    """Exit 6, one line on stderr naming `needles`, no traceback."""
    lines = result.output.strip().splitlines()
    assert result.exit_code == 6, result.output
    assert len(lines) == 1 and lines[0].startswith("error: not permitted: "), result.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_the_actor_is_the_database_role_and_only_a_service_names_someone_else(ledger_of) -> None:  # type: ignore[no-untyped-def]
    """alice's enqueue is booked as alice (her role), whatever GGPO_USER says: naming bob is refused,
    exit 6, nothing written; the worker's service role may act for alice."""
    team = ledger_of.team
    done = ledger_of.enqueue("alice", "by-alice")
    assert done.exit_code == 0, done.output
    assert scalar(team, "SELECT created_by FROM experiments") == "alice"
    assert scalar(team, "SELECT string_agg(DISTINCT actor, ',') FROM events") == "alice"
    before = contents(team)
    refused(ledger_of.enqueue("alice", "as-bob", GGPO_USER="bob"), "acting as 'bob' (GGPO_USER)",
            "PostgreSQL role 'alice'")
    refused(ledger_of.enqueue("carol", "lead-as-bob", GGPO_USER="bob"), "acting as 'bob'")  # a lead neither
    assert contents(team) == before
    done = ledger_of.enqueue("worker", "for-alice", GGPO_USER="alice")
    assert done.exit_code == 0, done.output
    assert scalar(team, "SELECT created_by FROM experiments WHERE name = 'for-alice'") == "alice"
    done = ledger_of("bob", "ledger", "import", str(SEED_000), "--name", "bobs-import")  # results that ran elsewhere
    assert done.exit_code == 0, done.output
    assert scalar(team, "SELECT count(*) FROM attempts a JOIN runs r ON r.id = a.run_id JOIN experiments e ON "
                        "e.id = r.experiment_id WHERE e.created_by = 'bob' AND r.result IS NOT NULL") == 15
    before = contents(team)
    for command in (["reconcile"], ["worker", "--burst"]):  # the service's work, refused before anything
        refused(ledger_of("bob", *command), "books the attempts of every run", "ggpo_service")
    assert contents(team) == before


def test_a_changed_ggpo_user_no_longer_escapes_the_per_user_cap(ledger_of) -> None:  # type: ignore[no-untyped-def]
    """Each two-run debug spec is estimated at 1.54 GPU-h; under a 2 GPU-h cap per user alice's second
    is over her cap (exit 3, recorded as her decision); naming bob, who has spent nothing, is refused
    (exit 6) instead of booking it under bob's cap, and bob himself still fits under his own."""
    team = ledger_of.team
    cap = {"GGPO_USER_GPU_HOURS_CAP": "2"}
    assert ledger_of.enqueue("alice", "first", **cap).exit_code == 0
    over = ledger_of.enqueue("alice", "second", **cap)
    assert over.exit_code == 3 and "user alice cap 2.00 GPU-h" in over.output, over.output
    assert scalar(team, "SELECT decided_by FROM decisions WHERE experiment_name = 'second'") == "alice"
    before = contents(team)
    refused(ledger_of.enqueue("alice", "third", GGPO_USER="bob", **cap), "acting as 'bob'")
    assert contents(team) == before
    assert ledger_of.enqueue("bob", "bobs", **cap).exit_code == 0


def test_a_member_may_not_cancel_retry_or_decide_on_a_colleagues_experiment(ledger_of, redis_url) -> None:  # type: ignore[no-untyped-def]
    """bob (alice's team-mate) and erin (another team) are refused cancel, retry and decide on alice's
    experiment, exit 6, one line naming whose it is: the ledger and Redis are left as they were.
    carol, the team's lead, may; alice may on her own."""
    from ggpo_batch.control.queue import RunQueue
    from ggpo_batch.ledger import connect

    team = ledger_of.team
    assert ledger_of.enqueue("alice", "mine").exit_code == 0
    queued, failed = "mine-v1-1-clean", "mine-v1-2-clean"
    service = connect(team.url("worker"))  # the worker's transitions: run 2 failed
    service.begin_attempt(failed, executor="debug", gpus=4, actor="worker", worker="w1")
    service.settle_attempt(failed, 1, lambda _r, _a: {"attempt_state": "failed", "run_state": "failed",
                                                      "reason": "boom"}, actor="worker", job_id="debug-1")
    service.engine.dispose()
    queue = RunQueue.from_url(redis_url, "teamq")
    before, waiting = contents(team), queue.waiting()
    for who in ("bob", "erin"):
        refused(ledger_of(who, "cancel", queued), f"changing run {queued}", "alice's experiment mine",
                f"PostgreSQL role '{who}'")
        refused(ledger_of(who, "cancel", "--experiment", "mine"), "alice's experiment mine")
        refused(ledger_of(who, "retry", failed, "--reason", "again"), f"changing run {failed}")
        refused(ledger_of(who, "decide", "mine", "--not-reproduced", "--reason", "r", "--cost-basis", "c"),
                "alice's experiment mine")
    assert contents(team) == before and queue.waiting() == waiting
    done = ledger_of("carol", "cancel", queued, "--reason", "the lead stops it")
    assert done.exit_code == 0 and "cancelled" in done.output, done.output
    assert queued not in queue.waiting()
    assert ledger_of("alice", "retry", failed, "--reason", "node swapped").exit_code == 0
    done = ledger_of("alice", "decide", "mine", "--not-reproduced", "--reason", "r", "--cost-basis", "c")
    assert done.exit_code == 0, done.output
    assert scalar(team, "SELECT state FROM runs WHERE run_key = :k", k=failed) == "not_reproduced"
    assert scalar(team, "SELECT string_agg(DISTINCT actor, ',' ORDER BY actor) FROM events") == "alice,carol,worker"


def test_a_members_direct_sql_cannot_do_what_the_cli_refuses(ledger_of) -> None:  # type: ignore[no-untyped-def]
    """bob, connected with psql-like SQL: reads everything; changes of alice's runs match no row;
    moving his own run to a state only a worker sets, writing a result, an event or a decision as
    someone else, an attempt, deleting anything, or changing an event is refused by PostgreSQL. The
    service may not change or delete an event either. Nothing changed."""
    import psycopg
    from psycopg import errors

    team = ledger_of.team
    assert ledger_of.enqueue("alice", "hers").exit_code == 0
    assert ledger_of.enqueue("bob", "his").exit_code == 0
    before = contents(team)
    hers, his = "hers-v1-1-clean", "his-v1-1-clean"
    url = team.url("bob").replace("+psycopg", "")
    with psycopg.connect(url, autocommit=True) as bob:
        assert bob.execute("SELECT count(*) FROM runs").fetchone() == (4,)  # reads everything
        assert bob.execute("UPDATE runs SET state = 'cancelled' WHERE run_key = %s", [hers]).rowcount == 0
        assert bob.execute("UPDATE attempts SET state = 'cancelled'").rowcount == 0
        his_id, his_exp = bob.execute("SELECT id, experiment_id FROM runs WHERE run_key = %s", [his]).fetchone()
        her_id = bob.execute("SELECT id FROM runs WHERE run_key = %s", [hers]).fetchone()[0]
        forbidden = [
            ("UPDATE runs SET state = 'succeeded' WHERE run_key = %s", [his]),
            ("UPDATE runs SET result = '{}' WHERE run_key = %s", [his]),
            ("UPDATE runs SET estimated_gpu_hours = 0 WHERE run_key = %s", [his]),
            (("INSERT INTO events (at, run_id, experiment_id, entity, to_state, actor) VALUES (now(), %s, %s, 'run', "
             "'cancelled', 'alice')"), [his_id, his_exp]),
            ("INSERT INTO events (at, run_id, entity, to_state, actor) VALUES (now(), %s, 'run', 'cancelled', 'bob')",
             [her_id]),
            (("INSERT INTO experiments (name, version, method, source, spec_hash, spec, gpus, created_by, created_at) "
             "VALUES ('fake', 1, 'ggpo', 'spec', 'h', '{}', 4, 'alice', now())"), None),
            (("INSERT INTO decisions (experiment_name, experiment_id, kind, decided_by, decided_at, review_done, "
             "automatic_retry) SELECT name, id, 'not_reproduced_high_cost', 'bob', now(), true, false FROM experiments "
             "WHERE name = 'hers'"), None),
            (("INSERT INTO attempts (run_id, number, executor, state, submitted_by, gpus, created_at) "
             "VALUES (%s, 1, 'debug', 'succeeded', 'bob', 4, now())"), [his_id]),
            # the tables rounds 3 and 4 added: provenance and curve points are the service's to book;
            # an evaluation a member queues is one of their own runs', queued, with no outcome
            ("INSERT INTO attempt_provenance (attempt_id, run_id, document) SELECT a.id, a.run_id, '{}' FROM attempts a",
             None),
            ("INSERT INTO curve_points (run_id, step, attempt_id, mean_reward) VALUES (%s, 0, 1, 1.0)", [his_id]),
            # a sequential design's looks are reconcile's (the service's) to record (migration 0012)
            (("INSERT INTO sequential_looks (experiment_id, arm, look, looks, seeds, seeds_paired, metric, alpha, "
              "spending, waves, per_seed, decision, decided_by, decided_at) VALUES (%s, 'clean', 1, 2, 2, 2, 'steps', "
              "0.05, 'obrien-fleming', '[2, 3]', '{}', 'crossed', 'bob', now())"), [his_exp]),
            (("INSERT INTO notification_deliveries (notification_id, sink, state, tries) SELECT id, 'w', "
              "'delivered', 1 FROM notifications"), None),
            (("INSERT INTO evaluations (run_id, key, name, state, source, spec, gpus, created_by, created_at, "
              "updated_at) VALUES (%s, 'hers-eval_x', 'x', 'queued', 'command', '{}', 1, 'bob', now(), now())"),
             [her_id]),
            (("INSERT INTO evaluations (run_id, key, name, state, source, spec, gpus, outcome, created_by, "
              "created_at, updated_at) VALUES (%s, 'his-eval_x', 'x', 'succeeded', 'command', '{}', 1, "
              "'{\"eval_reward\": 1}', 'bob', now(), now())"), [his_id]),
            ("UPDATE evaluations SET outcome = '{}'", None),
            (("INSERT INTO artifacts (path, sha256, size_bytes, kind, run_id, created_at) VALUES ('/x', 'h', 1, "
              "'run_record', %s, now())"), [her_id]),
            (("INSERT INTO component_runs (method, tier, night, state, actor, started_at) VALUES ('ggpo', "
              "'l1_mechanism', '2026-12-01', 'claimed', 'alice', now())"), None),
            ("UPDATE events SET actor = 'alice' WHERE actor = 'bob'", None),
            ("DELETE FROM events", None),
            ("DELETE FROM runs WHERE run_key = %s", [his]),
        ]
        for sql, params in forbidden:
            with pytest.raises(errors.InsufficientPrivilege):
                bob.execute(sql, params)
        # The outbox: a notice about alice's experiment, one naming someone else as its actor, one of a
        # kind only reconcile observes (issue 42: notifications had no row-level security).
        her_exp = bob.execute("SELECT experiment_id FROM runs WHERE run_key = %s", [hers]).fetchone()[0]
        notice = ("INSERT INTO notifications (dedupe_key, key, kind, subject, fields, experiment_id, created_at, "
                  "next_try_at) VALUES (%s, %s, %s, 'forged', %s, %s, now(), now())")
        for kind, fields, exp in (("run_failed", '{"actor": "bob"}', her_exp),
                                  ("cost_decision", '{"decided_by": "alice"}', his_exp),
                                  ("nightly_missed", '{"actor": "bob"}', None),
                                  ("experiment_finished", '{"actor": "bob"}', his_exp)):
            with pytest.raises(errors.InsufficientPrivilege):
                bob.execute(notice, [f"forged.{kind}", f"forged.{kind}.1", kind, fields, exp])
        with pytest.raises(errors.InsufficientPrivilege):
            bob.execute("UPDATE notifications SET subject = 'x'")
        with pytest.raises(errors.FeatureNotSupported, match="row-level security"):  # no bulk way around it
            bob.execute("COPY runs (experiment_id, run_key, arm, seed, state, config_hash, run_spec) FROM STDIN")
    with psycopg.connect(team.url("worker").replace("+psycopg", ""), autocommit=True) as worker:
        for sql in ("UPDATE events SET actor = 'nobody'", "DELETE FROM events", "DELETE FROM runs"):
            with pytest.raises(errors.InsufficientPrivilege):
                worker.execute(sql)
    assert contents(team) == before


def test_a_member_with_an_inline_queue_is_refused_before_anything(ledger_of) -> None:  # type: ignore[no-untyped-def]
    """memory:// would run a member's jobs in their own process, as them: exit 6, one line, nothing
    written (was: exit 0 with an experiment, 2 runs and 3 events)."""
    before = contents(ledger_of.team)
    res = ledger_of.enqueue("bob", "inline", GGPO_REDIS_URL="memory://")
    refused(res, "GGPO_REDIS_URL=memory://", "'bob'")
    assert contents(ledger_of.team) == before
    assert ledger_of.enqueue("worker", "inline-ok", GGPO_REDIS_URL="memory://").exit_code == 0  # the service may


def test_per_role_gpu_quotas_defer_one_persons_runs_not_everyones(ledger_of) -> None:  # type: ignore[no-untyped-def]
    """GGPO_ROLE_GPU_QUOTA=ggpo_member=4,ggpo_lead=8 and 4-GPU runs: alice (a member) may have one run
    in flight, her second is over her quota (deferred by the worker, not failed); carol (a lead, also a
    member: the larger applies) may have two; a role named in no limit gets GGPO_USER_GPU_QUOTA."""
    from ggpo_batch.ledger import QuotaExceeded, connect
    from ggpo_batch.ledger.quotas import UserQuota
    from ggpo_batch.ledger.submissions import AttemptPlan

    team = ledger_of.team
    for who in ("alice", "carol", "worker"):
        assert ledger_of.enqueue(who, f"q-{who}").exit_code == 0
    quota = UserQuota(default=12, by_role=(("ggpo_member", 4), ("ggpo_lead", 8)))
    service = connect(team.url("worker"))

    def take(key: str) -> None:
        service.begin_submission(key, actor="worker", worker="w1", plan=lambda _s, _q: AttemptPlan("debug", 4, None,
                                                                                                   quota))

    take("q-alice-v1-1-clean")
    with pytest.raises(QuotaExceeded, match="user alice: 4 GPUs in flight \\+ 4 > quota 4"):
        take("q-alice-v1-2-clean")
    take("q-carol-v1-1-clean")
    take("q-carol-v1-2-clean")
    take("q-worker-v1-1-clean")  # the service's own experiment: no role limit, the default 12
    take("q-worker-v1-2-clean")
    assert service.get_run("q-alice-v1-2-clean").state == "queued"
    service.engine.dispose()
