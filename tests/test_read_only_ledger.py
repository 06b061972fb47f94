"""A ledger one may read but not write (ggpo_batch/ledger/read_only.py): every reading command, and
the dashboard's API, answers on it exactly what it answers on the writable ledger; every writing
command is refused before it does anything, in one line, exit 6; nothing changes.

SQLite: one ledger is built, then copied into each case (the same content): a colleague's ledger in
a folder one may not write; a folder one may not write holding a writer's -wal and -shm (every page
in the log); the same -wal without its -shm (a backup that left it out); a read-only file in a
writable folder. Each runs as a user the files are read-only to (root without CAP_DAC_OVERRIDE,
tests/support/unprivileged.py). PostgreSQL: a role granted only SELECT, made and dropped here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from ggpo_batch.contracts.allocation import attempt_folder
from ggpo_batch.reporting.joblogs import log_path
from tests.dashboard.server import Dashboard, cli_env, get, ggpo
from tests.support.paths import REPO, SEED_000
from tests.support.services import wipe_pg
from tests.support.specs import DEBUG_SPEC
from tests.support.unprivileged import unprivileged_prefix

LIVE_KEY = "live-v1-1-clean"
SPEC = DEBUG_SPEC.format(name="dry")

# Every command that only reads, in the forms a script and a person use.
READERS = [
    ["status"], ["status", "--json"], ["status", "--runs", "--json"], ["status", "-e", "done-exp", "--runs"],
    ["status", "--components", "--json"],
    ["report", "done-exp"], ["report", "done-exp", "--json"],
    ["ledger", "export", "--format", "csv"], ["ledger", "export", "--format", "json"],
    ["logs", LIVE_KEY], ["logs", LIVE_KEY, "--json"], ["notifications"], ["notifications", "--json"],
    ["db", "current", "--json"],
    ["enqueue", "{spec}", "--dry-run"], ["enqueue", "{spec}", "--dry-run", "--json"],
    ["costs", "--by", "experiment"], ["costs", "--by", "month", "--json"],
    ["plan", "{spec}", "--sigma", "0.1", "--effect", "0.05"], ["advise", "done-exp", "--metric", "steps", "--json"],
    ["canary", "live"], ["canary", "live", "--json"],
]
ROUTES = ["/api/status", "/api/status?runs=1", "/api/components", "/api/experiments/done-exp", "/api/costs",
          f"/api/runs/{LIVE_KEY}", "/", "/experiments/done-exp", f"/runs/{LIVE_KEY}", "/costs?by=user", "/metrics"]
API_ROUTES = [r for r in ROUTES if r.startswith("/api/")]
# Every command that writes (a worker needs a Redis URL, not memory://: nothing listens on port 1,
# so one that got past the refusal would fail otherwise, exit 4).
WRITERS = [
    ["enqueue", "{spec}"], ["worker", "--burst"], ["cancel", LIVE_KEY], ["retry", LIVE_KEY, "--reason", "again"],
    ["decide", "other", "--not-reproduced", "--reason", "costly", "--cost-basis", "a paper"],
    ["reconcile"], ["release", "live"], ["db", "upgrade"], ["db", "downgrade", "base", "--yes"],
    ["ledger", "import", str(SEED_000), "--name", "again"], ["nightly", "--seeds", "42"],
    ["gc", "--older-than", "0d"], ["evaluate", "done-exp", "--data", "eval2.jsonl", "--name", "eval2"],
    ["canary", "live", "--rerun"],
]


def build_ledger(url: str, jobs_dir: Path) -> None:
    """The content every case reads: an imported experiment (15 runs), a live one (a run submitted
    with its logs, one queued), and a decision about an experiment never queued."""
    from ggpo_batch.control.costguard import decide_not_reproduced
    from ggpo_batch.control.importer import import_results
    from ggpo_batch.ledger import NewRun, connect, upgrade
    from ggpo_batch.ledger.db import make_engine

    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    led = connect(url)
    try:
        import_results(led, SEED_000, actor="owner", name="done-exp")
        led.create_experiment(name="live", version=1, method="ggpo", source="spec", spec_hash="h", spec={}, gpus=4,
                              actor="owner", runs=[NewRun(run_key=f"live-v1-{seed}-clean", arm="clean", seed=seed,
                                                          config_hash="c", run_spec={}) for seed in (1, 2)])
        led.begin_attempt(LIVE_KEY, executor="local", gpus=4, actor="owner", worker="host.1")
        led.mark_submitted(LIVE_KEY, 1, job_id="4242", actor="owner")
        decide_not_reproduced(led, "paper-full", actor="owner", reason="too costly",
                              cost_basis="the paper's 64-GPU setup", estimated_gpu_hours=5000.0)
    finally:
        led.engine.dispose()
    folder = attempt_folder(jobs_dir, LIVE_KEY, 1)
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(2):
        log_path(folder, "4242", rank, "stdout").write_text(f"rank {rank} says hello\n")
        log_path(folder, "4242", rank, "stderr").write_text(f"rank{rank} step 1 loss 0.5\n")


def batch(env: dict[str, str], *, commands: list[list[str]], routes: list[str] = (),  # type: ignore[assignment]
          prefix: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """`commands` and `routes` answered by one process (tests/support/cli_batch.py) run with `prefix`."""
    job = {"commands": [{"args": c, "env": {"GGPO_REDIS_URL": "redis://127.0.0.1:1/0"} if c[0] == "worker" else None}
                        for c in commands], "routes": list(routes)}
    proc = subprocess.run([*prefix, sys.executable, "-m", "tests.support.cli_batch"], input=json.dumps(job),
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def answers(result: dict[str, Any], hide: str) -> list[Any]:
    """What each reading command and API route answered, the case's ledger location written as <ledger>."""
    def clean(s: str) -> str:
        return s.replace(hide, "<ledger>")

    shown = [(c["args"], c["exit"], clean(c["stdout"]), clean(c["stderr"]), c["bug"])
             for c in result["commands"][:len(READERS)]]
    return shown + [(route, status, clean(body)) for route, (status, body) in zip(ROUTES, result["routes"])
                    if route in API_ROUTES]


def assert_answered(result: dict[str, Any]) -> None:
    """Every reading command exit 0 with something on stdout, every route 200: a reference worth
    comparing with."""
    failed = [(c["args"], c["exit"], c["stderr"][-500:]) for c in result["commands"] if c["exit"] or not c["stdout"]]
    assert not failed, failed
    assert [status for status, _ in result["routes"]] == [200] * len(ROUTES)
    assert "rank 0 says hello" in " ".join(c["stdout"] for c in result["commands"])  # `logs` read the job's log


def assert_refusals(result: dict[str, Any], *, names: list[str]) -> None:
    """Each writer (after the readers): exit 6, one line `error: not permitted: ...` holding every one
    of `names`."""
    assert len(result["commands"]) == len(READERS) + len(WRITERS)
    for c in result["commands"][len(READERS):]:
        lines = c["stderr"].strip().splitlines()
        assert c["exit"] == 6 and c["bug"] is None, (c["args"], c["exit"], c["stderr"], c["bug"])
        assert len(lines) == 1 and lines[0].startswith("error: not permitted: "), (c["args"], c["stderr"])
        assert c["stdout"] == "", (c["args"], c["stdout"])
        assert all(n in lines[0] for n in names), (c["args"], names, lines[0])


def files_of(folder: Path) -> dict[str, str]:
    """Every file under `folder` and a digest of its bytes and mode: what a refused or reading
    command must leave as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() + oct(p.stat().st_mode)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def filled(commands: list[list[str]], spec: Path) -> list[list[str]]:
    return [[a.replace("{spec}", str(spec)) for a in c] for c in commands]


# -- SQLite ------------------------------------------------------------------------------------------


def log_in_use(source: Path, folder: Path, *, shm: bool) -> None:
    """`folder`/ledger.sqlite3 as a writer holding it open leaves it: every page of `source` in the
    -wal, none checkpointed into the file; with its -shm, or without (a copy that left it out)."""
    work = folder.with_name(folder.name + "-writer")
    work.mkdir()
    held = work / "ledger.sqlite3"
    with closing(sqlite3.connect(held, isolation_level=None)) as writer:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        with closing(sqlite3.connect(source)) as src:
            src.backup(writer)
        folder.mkdir()
        for side in ("", "-wal") + (("-shm",) if shm else ()):
            shutil.copyfile(f"{held}{side}", folder / f"ledger.sqlite3{side}")
    shutil.rmtree(work)
    # the data is in the log only: read without it, the file has no tables
    with (closing(sqlite3.connect(f"file:{folder / 'ledger.sqlite3'}?immutable=1", uri=True)) as without_log,
          pytest.raises(sqlite3.OperationalError, match="no such table")):
        without_log.execute("SELECT count(*) FROM runs").fetchone()


def read_only(folder: Path, *, colleague: bool) -> None:
    """Make `folder` and its files read-only to the reader: as root (who reads without
    CAP_DAC_OVERRIDE), with `colleague`, owned by another user who may still write them; else
    without write permission for anyone (a backup on read-only storage)."""
    if colleague and os.geteuid() == 0:
        for p in [folder, *folder.rglob("*")]:
            os.chown(p, 65534, 65534)
        return
    for p in folder.iterdir():
        p.chmod(0o444)
    folder.chmod(0o555)


def writable_again(folder: Path) -> None:
    folder.chmod(0o755)
    for p in folder.iterdir():
        p.chmod(0o644)


@pytest.mark.slow
def test_sqlite_ledger_read_only_to_the_user_answers_like_the_writable_one(tmp_path: Path) -> None:
    """Each case answers every reading command and dashboard route exactly as the writable ledger
    does, opened as the case allows (the plan is checked, so each case tests its own path); every
    writing command is refused naming the file; no file of the case changed, none was added."""
    prefix = unprivileged_prefix()
    data = tmp_path / "data"
    reference = tmp_path / "writable"
    reference.mkdir()
    build_ledger(f"sqlite:///{reference / 'ledger.sqlite3'}", data / "jobs")
    spec = tmp_path / "dry.toml"
    spec.write_text(SPEC)
    source = reference / "ledger.sqlite3"
    cases = {"colleague's folder": tmp_path / "colleague", "writer's log in use": tmp_path / "in-use",
             "log without its shm": tmp_path / "no-shm", "read-only file": tmp_path / "ro-file"}
    plans = {"colleague's folder": "immutable", "writer's log in use": "mode=ro", "log without its shm": "copy",
             "read-only file": "immutable"}
    cases["colleague's folder"].mkdir()
    shutil.copyfile(source, cases["colleague's folder"] / "ledger.sqlite3")
    log_in_use(source, cases["writer's log in use"], shm=True)
    log_in_use(source, cases["log without its shm"], shm=False)
    cases["read-only file"].mkdir()
    shutil.copyfile(source, cases["read-only file"] / "ledger.sqlite3")
    for name, folder in cases.items():
        if name == "read-only file":
            (folder / "ledger.sqlite3").chmod(0o444)
        else:
            read_only(folder, colleague=name == "colleague's folder")
    folders = [data, *(p for p in data.rglob("*") if p.is_dir())]
    for f in folders:  # the job logs are read-only too: nothing a reader does writes there
        f.chmod(0o555)

    def env(folder: Path) -> dict[str, str]:
        return cli_env(GGPO_DB_URL=f"sqlite:///{folder / 'ledger.sqlite3'}", GGPO_REDIS_URL="memory://",
                       GGPO_DATA_DIR=str(data), GGPO_USER="reader")

    try:
        expected = batch(env(reference), commands=filled(READERS, spec), routes=ROUTES)
        assert expected["plan"] == "mode=ro"
        assert_answered(expected)
        want = answers(expected, str(reference))
        for name, folder in cases.items():
            before = files_of(folder)
            got = batch(env(folder), commands=filled(READERS + WRITERS, spec), routes=ROUTES, prefix=prefix)
            assert got["plan"] == plans[name], name
            assert answers(got, str(folder)) == want, name
            assert all(status == 200 for status, _ in got["routes"]), name
            assert_refusals(got, names=[str(folder / "ledger.sqlite3"), "read-only to you"])
            assert files_of(folder) == before, name
    finally:
        for f in folders:
            f.chmod(0o755)


@pytest.mark.slow
def test_dashboard_on_a_colleagues_ledger_serves_and_follows_the_owners_writes(tmp_path: Path) -> None:
    """`ggpo-batch dashboard` on a ledger in a folder its reader may not write (opened immutable)
    serves; when the ledger's owner writes to it, the next request shows the change (an immutable
    connection is replaced once the file moved on)."""
    prefix = unprivileged_prefix()
    folder = tmp_path / "ledger"
    folder.mkdir()
    owner = cli_env(GGPO_DB_URL=f"sqlite:///{folder / 'ledger.sqlite3'}", GGPO_REDIS_URL="memory://",
                    GGPO_DATA_DIR=str(tmp_path / "data"), GGPO_USER="owner")
    build_ledger(owner["GGPO_DB_URL"], tmp_path / "data" / "jobs")
    read_only(folder, colleague=True)
    dash = Dashboard(owner, tmp_path / "dashboard.log", prefix=prefix)
    try:
        code, body = get(f"{dash.url}/api/status")
        assert code == 200, body
        assert [d["experiment"] for d in json.loads(body)["decided"]] == ["paper-full"]
        with owner_may_write(folder):
            done = ggpo(owner, "decide", "second", "--not-reproduced", "--reason", "r", "--cost-basis", "c")
        assert done.returncode == 0, done.stderr
        code, body = get(f"{dash.url}/api/status")
        assert code == 200, body
        assert sorted(d["experiment"] for d in json.loads(body)["decided"]) == ["paper-full", "second"]
    finally:
        dash.stop()
    assert "Traceback" not in dash.log.read_text()


@contextmanager
def owner_may_write(folder: Path) -> Iterator[None]:
    """The owner writes (root may anyway; a non-root owner gives itself write permission back)."""
    if os.geteuid() == 0:
        yield
        return
    writable_again(folder)
    try:
        yield
    finally:
        read_only(folder, colleague=False)


@pytest.mark.slow
def test_a_ledger_one_may_not_even_read_is_refused_as_not_permitted(tmp_path: Path) -> None:
    """A ledger file one may not read, or one in a folder one may not open: exit 6, one line naming
    the file (not "unavailable", and not "run db upgrade" as if it were absent)."""
    prefix = unprivileged_prefix()
    unreadable, closed = tmp_path / "unreadable", tmp_path / "closed"
    for folder in (unreadable, closed):
        folder.mkdir()
        build_ledger(f"sqlite:///{folder / 'ledger.sqlite3'}", tmp_path / "data" / "jobs")
    (unreadable / "ledger.sqlite3").chmod(0o600)
    closed.chmod(0o700)
    if os.geteuid() == 0:  # another user's
        os.chown(unreadable / "ledger.sqlite3", 65534, 65534)
        os.chown(closed, 65534, 65534)
    else:
        (unreadable / "ledger.sqlite3").chmod(0o000)
        closed.chmod(0o000)
    try:
        for folder, why in ((unreadable, "you may not read the file"), (closed, f"you may not open its folder {closed}")):
            env = cli_env(GGPO_DB_URL=f"sqlite:///{folder / 'ledger.sqlite3'}", GGPO_REDIS_URL="memory://",
                          GGPO_DATA_DIR=str(tmp_path / "data"))
            proc = subprocess.run([*prefix, sys.executable, "-m", "ggpo_batch.cli", "status"], env=env, cwd=REPO,
                                  capture_output=True, text=True, timeout=120, check=False)
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 6 and len(lines) == 1, proc.stderr[-2000:]
            assert lines[0].startswith(f"error: not permitted: reading the ledger {folder / 'ledger.sqlite3'}, {why}")
    finally:
        closed.chmod(0o755)


# -- PostgreSQL --------------------------------------------------------------------------------------


@pytest.fixture
def select_only_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """(admin URL, reader URL) of an empty database of this session, the reader's role granted only
    SELECT (on the tables as they are once built: `grant`). Roles are cluster-wide: the role is
    named for this test alone and dropped even when the test fails."""
    role = f"ggpo_reader_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    wipe_pg(pg_url)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
    try:
        yield pg_url, make_url(pg_url).set(username=role).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()
        wipe_pg(pg_url)


def grant_select(admin_url: str, role: str) -> None:
    engine = create_engine(admin_url)
    with engine.begin() as conn:
        conn.execute(text(f'GRANT USAGE ON SCHEMA public TO "{role}"'))
        conn.execute(text(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"'))
    engine.dispose()


def table_contents(admin_url: str) -> dict[str, list[str]]:
    """Every row of every table, as text, in order: what a refused command must leave as it was."""
    engine = create_engine(admin_url)
    try:
        with engine.connect() as conn:
            tables = conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                                       "ORDER BY tablename")).scalars().all()
            return {t: sorted(str(tuple(r)) for r in conn.execute(text(f'SELECT * FROM "{t}"'))) for t in tables}
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.slow
def test_postgres_role_granted_only_select_reads_like_the_owner_and_may_not_write(
        select_only_role: tuple[str, str], tmp_path: Path) -> None:
    """Every reading command and dashboard route answers the SELECT-only role what it answers the
    ledger's owner; every writing command is refused naming the role and the missing privilege,
    before anything: every table's rows unchanged. The reference (owner's) reads run read-only too."""
    admin_url, reader_url = select_only_role
    role = make_url(reader_url).username
    data = tmp_path / "data"
    build_ledger(admin_url, data / "jobs")
    grant_select(admin_url, role)
    spec = tmp_path / "dry.toml"
    spec.write_text(SPEC)

    def env(url: str) -> dict[str, str]:
        return cli_env(GGPO_DB_URL=url, GGPO_REDIS_URL="memory://", GGPO_DATA_DIR=str(data), GGPO_USER="reader")

    expected = batch(env(admin_url), commands=filled(READERS, spec), routes=ROUTES)
    assert_answered(expected)
    before = table_contents(admin_url)
    got = batch(env(reader_url), commands=filled(READERS + WRITERS, spec), routes=ROUTES)
    hide = make_url(admin_url).render_as_string(hide_password=True).split("@", 1)[1]
    assert answers(got, f"{role}@{hide}") == answers(expected, f"postgres@{hide}")
    assert all(status == 200 for status, _ in got["routes"])
    assert_refusals(got, names=[f"role {role!r}", "INSERT"])
    assert table_contents(admin_url) == before


def test_the_reading_commands_named_in_refusals_are_those_that_open_the_ledger_read_only() -> None:
    """The list a refusal names (read_only.READING_COMMANDS) is the commands marked `pass_reader`,
    plus `enqueue --dry-run`; every command is registered (so none is missed)."""
    import click

    from ggpo_batch.cli.app import COMMAND_MODULES, cli
    from ggpo_batch.ledger.read_only import READING_COMMANDS

    ctx = click.Context(cli)
    marked = set()

    def walk(command: click.Command, path: str) -> None:
        if getattr(command.callback, "reads_only", False):
            marked.add(path.strip())
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    for name in COMMAND_MODULES:
        walk(cli.get_command(ctx, name), name)
    assert marked | {"enqueue --dry-run"} == set(READING_COMMANDS.split(", "))
    # every command is run in each case (the dashboard: its routes); train, init and config touch no ledger
    assert {c[0] for c in READERS + WRITERS} | {"dashboard", "train", "init", "config"} == set(COMMAND_MODULES)


# -- what a reading engine may do, on both backends -----------------------------------------------


def test_a_reading_engine_cannot_write_even_a_writable_ledger(ledger) -> None:  # type: ignore[no-untyped-def]
    """Opened for reading, the ledger refuses a write on the database's side (SQLite query_only,
    PostgreSQL read-only transactions), and the CLI explains it as a refusal, exit 6."""
    from sqlalchemy.exc import DBAPIError

    from ggpo_batch.ledger.db import make_engine
    from ggpo_batch.ledger.read_only import write_refused

    engine = make_engine(ledger.engine.url.render_as_string(hide_password=False), reading=True)
    try:
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text("DELETE FROM events"))
        refusal = write_refused(caught.value)
        assert refusal is not None and refusal.exit_code == 6, caught.value
        assert refusal.message.startswith("not permitted: ")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alembic_version")).scalar_one() == 1
    finally:
        engine.dispose()
