"""Hostile inputs and broken services, one test (or more) per class of the issue "every bad input
and broken service gets one clear line and the right exit code": database errors, SQLite and
PostgreSQL disagreeing, imports the queue cannot hold, work stranded by a Redis outage, hangs and
unbounded reads, secrets, and the small ones. Each case: the exit code of the contract (2 bad
input, 4 a service), one line on stderr, no traceback, the ledger unchanged on refusal.

The property-based counterpart (hypothesis, both backends at once) is test_hostile_properties.py.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text

from ggpo_batch.cli import cli
from ggpo_batch.common.netutil import free_port
from tests.support.paths import REPO, SEED_000
from tests.support.specs import DEBUG_SPEC
from tests.support.unprivileged import unprivileged_prefix

TABLES = ("experiments", "runs", "attempts", "events", "decisions")


# -- helpers --------------------------------------------------------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    runner = CliRunner(env=env)
    return runner.invoke(cli, list(args), catch_exceptions=True)


def assert_refused(res: Result, code: int, *, says: str | None = None) -> str:
    """Exit `code`, exactly one line on stderr starting `error:`, no traceback; returns the line."""
    assert res.exception is None or isinstance(res.exception, SystemExit), (res.exception, res.output)
    assert res.exit_code == code, (res.exit_code, res.output)
    assert "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    if says is not None:
        assert says in lines[0], lines[0]
    return lines[0]


def run_subprocess(args: list[str], env: dict[str, str], *, timeout: float,
                   privileged: bool = True) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (for what could hang or eat memory in the old code), with at
    most 2 GiB of address space; with `privileged=False` a root caller drops the capabilities that
    let root ignore file permissions (so a read-only folder is read-only to it)."""
    cmd = [*([] if privileged else unprivileged_prefix()), sys.executable, "-m", "ggpo_batch.cli", *args]

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit_memory, check=False)


def assert_one_line_process(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    return lines[0]


def fingerprint(db_url: str) -> dict[str, int]:
    """Rows per ledger table: what a refused command must leave as it was."""
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}
    finally:
        engine.dispose()


def seed_records() -> dict[str, Any]:
    return json.loads(SEED_000.read_text())


def one_record(mutate=None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """A results file of one valid record (seed-000 schema), changed by `mutate(rec) -> key`."""
    key, rec = next(iter(seed_records().items()))
    rec = json.loads(json.dumps(rec))
    if mutate is not None:
        key = mutate(rec) or key
    return {key: rec}


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, allow_nan=True))
    return path


def with_arm(arm: str):  # type: ignore[no-untyped-def]
    def mutate(rec: dict[str, Any]) -> str:
        rec["arm"] = arm
        rec["timing"]["arm"] = arm
        return f"{rec['seed']}/{arm}"
    return mutate


def with_seed(seed: int):  # type: ignore[no-untyped-def]
    def mutate(rec: dict[str, Any]) -> str:
        rec["seed"] = seed
        return f"{seed}/{rec['arm']}"
    return mutate


SPEC = DEBUG_SPEC


@pytest.fixture
def upgraded(env: dict[str, str]) -> dict[str, str]:
    """`env` (SQLite and PostgreSQL) with the ledger at head."""
    res = run_cli("db", "upgrade")
    assert res.exit_code == 0, res.output
    return env


# -- 1. database errors keep the exit-code contract ---------------------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_1_corrupt_or_truncated_sqlite_ledger_is_one_line_exit_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  damage: str) -> None:
    db = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv("GGPO_DB_URL", f"sqlite:///{db}")
    monkeypatch.setenv("GGPO_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("GGPO_USER", "tester")
    if damage == "garbage":
        db.write_bytes(b"this is not a database file, whatever its name says\n" * 100)
    else:
        # In a process of its own: an engine left open in this one could be collected mid-test
        # and checkpoint its write-ahead log into the truncated file, repairing it.
        upgraded = run_subprocess(["db", "upgrade"], {**os.environ, "GGPO_REDIS_URL": "memory://"}, timeout=60)
        assert upgraded.returncode == 0, upgraded.stderr
        data = db.read_bytes()
        for side in ("-wal", "-shm"):
            Path(f"{db}{side}").unlink(missing_ok=True)
        db.write_bytes(data[: len(data) // 3])
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="c1"))
    for args in (["status"], ["db", "upgrade"], ["db", "current"], ["enqueue", str(spec), "--dry-run"],
                 ["ledger", "import", str(SEED_000)]):
        line = assert_refused(run_cli(*args), 4)
        assert any(w in line for w in ("not a database", "malformed", "disk I/O error")), (args, line)


@pytest.mark.slow
def test_1_read_only_ledger_folder_and_lock_file_are_one_line(tmp_path: Path) -> None:
    """A team ledger one may read but not write: reading commands answer, a writing one is refused
    in one line, exit 6 (tests/test_read_only_ledger.py has every command); a read-only enqueue lock
    beside a writable ledger, and a folder that cannot be created: one line, exit 4."""
    folder = tmp_path / "ro"
    folder.mkdir()
    base = {**os.environ, "GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester",
            "GGPO_REDIS_URL": "memory://", "GGPO_DB_URL": f"sqlite:///{folder / 'ledger.sqlite3'}"}
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="ro1"))
    assert run_subprocess(["db", "upgrade"], base, timeout=60).returncode == 0
    lock = folder / "ledger.sqlite3.enqueue.lock"
    lock.write_text("")
    lock.chmod(0o444)  # the lock file read-only, the folder writable: enqueue cannot take the lock
    line = assert_one_line_process(run_subprocess(["enqueue", str(spec)], base, timeout=60, privileged=False), 4)
    assert "lock" in line and "ledger.sqlite3.enqueue.lock" in line
    os.chmod(folder, 0o555)  # now the folder too: reading commands still answer, writing ones are refused
    try:
        tmp_path.chmod(0o755)
        for args in (["status"], ["db", "current"], ["enqueue", str(spec), "--dry-run"]):
            done = run_subprocess(args, base, timeout=60, privileged=False)
            assert done.returncode == 0 and not done.stderr, (args, done.stderr)
        line = assert_one_line_process(run_subprocess(["enqueue", str(spec)], base, timeout=60, privileged=False), 6)
        assert "not permitted" in line and f"{folder / 'ledger.sqlite3'}" in line and "read-only" in line, line
    finally:
        os.chmod(folder, 0o755)
    nowhere = {**base, "GGPO_DB_URL": "sqlite:////proc/ggpo-no-such-folder/ledger.sqlite3"}
    line = assert_one_line_process(run_subprocess(["db", "upgrade"], nowhere, timeout=60), 4)
    assert "/proc/ggpo-no-such-folder" in line
    line = assert_one_line_process(run_subprocess(["status"], nowhere, timeout=60), 2)  # reading creates nothing
    assert "/proc/ggpo-no-such-folder" in line and "db upgrade" in line


def test_1_concurrent_import_of_one_file_is_already_imported_not_a_crash(ledger) -> None:  # type: ignore[no-untyped-def]
    """The loser of two concurrent imports of the same file hits the unique (name, version) key:
    it reports "already imported" (created False); the ledger holds one experiment."""
    from ggpo_batch.control.importer import import_results

    import_results(ledger, SEED_000, actor="a")
    events = len(ledger.events())
    real = ledger.latest_experiment
    calls = []

    def stale_check(name: str):  # type: ignore[no-untyped-def]
        calls.append(name)
        return None if len(calls) == 1 else real(name)  # the check ran before the winner committed

    ledger.latest_experiment = stale_check
    rep = import_results(ledger, SEED_000, actor="b")
    assert not rep.created and rep.version == 1
    ledger.latest_experiment = real
    assert len(ledger.experiments()) == 1 and len(ledger.events()) == events


@pytest.mark.slow
def test_1_concurrent_import_processes(upgraded: dict[str, str]) -> None:
    """Four `ledger import` processes of the same file at once: all exit 0, one imports it."""
    env = {**os.environ}
    procs = [subprocess.Popen([sys.executable, "-m", "ggpo_batch.cli", "ledger", "import", str(SEED_000), "--json"],
                              env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    created = [json.loads(o[0])["created"] for o in outs]
    assert created.count(True) == 1, created
    assert fingerprint(upgraded["GGPO_DB_URL"])["experiments"] == 1


def test_1_db_upgrade_on_unknown_revision_is_one_line_exit_2(upgraded: dict[str, str]) -> None:
    url = upgraded["GGPO_DB_URL"]
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'ffff_future'"))
    engine.dispose()
    for args in (["db", "upgrade"], ["status"], ["db", "downgrade", "base", "--yes"]):
        assert_refused(run_cli(*args), 2, says="ffff_future")
    assert_refused(run_cli("db", "upgrade", "--revision", "no_such_rev"), 2)


def test_1_tables_without_revision_are_refused_alike_by_status_and_db_upgrade(upgraded: dict[str, str]) -> None:
    """status must not advise the `db upgrade` that then fails: both refuse, same words, exit 2."""
    url = upgraded["GGPO_DB_URL"]
    assert run_cli("ledger", "import", str(SEED_000)).exit_code == 0
    before = fingerprint(url)
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
    a = assert_refused(run_cli("status"), 2, says="has tables but no ledger revision")
    b = assert_refused(run_cli("db", "upgrade"), 2, says="has tables but no ledger revision")
    assert a == b and "run `ggpo-batch db upgrade`" not in a
    assert fingerprint(url) == before


# -- 2. SQLite and PostgreSQL answer alike ---------------------------------------------------------------


def test_2_names_longer_than_their_column_are_refused_on_both(upgraded: dict[str, str], tmp_path: Path) -> None:
    url = upgraded["GGPO_DB_URL"]
    long_arm = "a" * 65  # runs.arm is VARCHAR(64)
    before = fingerprint(url)
    cases = [
        (["ledger", "import", str(SEED_000), "--name", "x" * 129], None, "--name"),
        (["ledger", "import", str(write_json(tmp_path / "a.json", one_record(with_arm(long_arm))))], None, "arm"),
        (["decide", "y" * 200, "--not-reproduced", "--reason", "r", "--cost-basis", "c"], None, "EXPERIMENT"),
        (["decide", "ok", "--not-reproduced", "--reason", "r", "--cost-basis", "c"], {"GGPO_USER": "u" * 129},
         "GGPO_USER"),
        (["ledger", "import", str(SEED_000)], {"GGPO_USER": "u" * 129}, "GGPO_USER"),
    ]
    for args, extra, says in cases:
        assert_refused(run_cli(*args, env=extra), 2, says=says)
    assert fingerprint(url) == before


def test_2_nan_and_huge_integers_are_refused_on_both(upgraded: dict[str, str], tmp_path: Path) -> None:
    url = upgraded["GGPO_DB_URL"]
    before = fingerprint(url)

    def nan_in_free_field(rec: dict[str, Any]) -> None:
        rec["training"]["cost_limitations"] = float("nan")  # a field the record schema does not type-check

    def inf_in_templates(rec: dict[str, Any]) -> None:
        rec["budget"]["limitation"] = [1.0, float("inf")]

    files = {
        "nan": write_json(tmp_path / "nan.json", one_record(nan_in_free_field)),
        "inf": write_json(tmp_path / "inf.json", one_record(inf_in_templates)),
        "seed 2**70": write_json(tmp_path / "big.json", one_record(with_seed(2**70))),
        "seed -1": write_json(tmp_path / "neg.json", one_record(with_seed(-1))),
    }
    for case, path in files.items():
        line = assert_refused(run_cli("ledger", "import", str(path)), 2)
        assert str(path) in line, (case, line)
    spec = tmp_path / "nan.toml"
    spec.write_text(SPEC.format(name="nan1") + "[train]\naux_coef = nan\n")
    assert_refused(run_cli("enqueue", str(spec), "--dry-run"), 2)
    for value in ("nan", "inf"):
        assert_refused(run_cli("decide", "x", "--not-reproduced", "--reason", "r", "--cost-basis", "c",
                               "--estimated-gpu-hours", value), 2, says="--estimated-gpu-hours")
    assert_refused(run_cli("report", "x", "--version", str(2**70)), 2, says="--version")
    assert fingerprint(url) == before


def test_2_text_the_database_cannot_hold_is_refused_on_both(upgraded: dict[str, str], tmp_path: Path) -> None:
    """An undecodable byte in an argument (a lone surrogate in Python), a NUL in a results file."""
    url = upgraded["GGPO_DB_URL"]
    before = fingerprint(url)
    assert_refused(run_cli("decide", "x", "--not-reproduced", "--reason", "bad \udcff byte", "--cost-basis", "c"), 2)
    assert_refused(run_cli("status", "-e", "\udcff"), 2)
    assert_refused(run_cli("decide", "ok", "--not-reproduced", "--reason", "r", "--cost-basis", "c",
                           env={"GGPO_USER": "bad\udcffuser"}), 2, says="GGPO_USER")

    def nul(rec: dict[str, Any]) -> None:
        rec["training"]["cost_limitations"] = "a\u0000b"

    assert_refused(run_cli("ledger", "import", str(write_json(tmp_path / "nul.json", one_record(nul)))), 2)
    assert fingerprint(url) == before


# -- 3. import accepts only what the queue can hold; imported runs are not retried ---------------------


def test_3_import_refuses_an_arm_name_rq_cannot_hold(upgraded: dict[str, str], tmp_path: Path) -> None:
    before = fingerprint(upgraded["GGPO_DB_URL"])
    for arm in ("clean.v2", "with space", "\u00e9t\u00e9", "a-b", "x/y"):
        path = write_json(tmp_path / "arm.json", one_record(with_arm(arm)))
        assert_refused(run_cli("ledger", "import", str(path)), 2, says="arm")
    assert fingerprint(upgraded["GGPO_DB_URL"]) == before


def test_3_retrying_an_imported_run_is_refused(upgraded: dict[str, str], redis_url: str) -> None:
    """An imported run has no runnable spec: even in a retryable state (older releases booked
    failed records as failed) `retry` refuses it, so no worker fails on it forever."""
    import redis

    url = upgraded["GGPO_DB_URL"]
    assert run_cli("ledger", "import", str(SEED_000), "--name", "imp").exit_code == 0
    key = "imp-v1-20261012-clean"
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.begin() as conn:
        assert conn.execute(text("UPDATE runs SET state = 'failed' WHERE run_key = :k"), {"k": key}).rowcount == 1
    engine.dispose()
    before = fingerprint(url)
    assert_refused(run_cli("retry", key, "--reason", "try", env={"GGPO_REDIS_URL": redis_url}), 2,
                   says="imported")
    assert fingerprint(url) == before
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_3_one_bad_run_does_not_stop_reconcile_for_the_others(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two runs whose workers died while submitting; one has a run spec no release can read. The
    other is still resolved; the bad one is counted and logged."""
    from datetime import timedelta

    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.control.queue import RunQueue
    from ggpo_batch.control.reconcile import reconcile
    from ggpo_batch.spec.parse import load_spec

    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="rb"))
    enqueue_spec(ledger, settings, load_spec(spec), actor="t", dry_run=False)
    keys = ["rb-v1-1-clean", "rb-v1-2-clean"]
    for k in keys:
        ledger.begin_attempt(k, executor="debug", gpus=4, actor="t", worker="dead")
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE runs SET run_spec = :s WHERE run_key = :k"),
                     {"s": json.dumps({"version": 99}), "k": keys[0]})
    rep = reconcile(ledger, settings, [RunQueue.from_url(settings.redis_url, settings.queue)], actor="r",
                    stale_after=timedelta(0))
    assert rep.errors == 1 and rep.resolved_submitting == 1
    assert ledger.get_run(keys[1]).state == "lost"


# -- 4. no work lost after a Redis outage ------------------------------------------------------------------


def test_4_enqueue_again_after_a_redis_outage_puts_the_stranded_runs_back(upgraded: dict[str, str],
                                                                         redis_url: str, tmp_path: Path) -> None:
    from ggpo_batch.control.queue import RunQueue

    spec = tmp_path / "s.toml"
    spec.write_text(SPEC.format(name="outage"))
    down = f"redis://127.0.0.1:{free_port()}/0"
    assert_refused(run_cli("enqueue", str(spec), env={"GGPO_REDIS_URL": down}), 4, says="Redis")
    assert fingerprint(upgraded["GGPO_DB_URL"])["runs"] == 2  # committed before Redis was asked
    res = run_cli("enqueue", str(spec), "--json", env={"GGPO_REDIS_URL": redis_url, "GGPO_QUEUE": "q4"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["enqueued"] == 0 and out["restored"] == 2
    assert set(RunQueue.from_url(redis_url, "ggpo").waiting()) == {"outage-v1-1-clean", "outage-v1-2-clean"}
    again = run_cli("enqueue", str(spec), env={"GGPO_REDIS_URL": redis_url})
    assert again.exit_code == 0 and "put back" not in again.output  # nothing stranded any more


# -- 5. no hang, no unbounded read ---------------------------------------------------------------------------


@pytest.fixture
def silent_port():  # type: ignore[no-untyped-def]
    """A TCP port that accepts connections and never answers (another service, a black hole)."""
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(timeout=2)
    for c in held:
        c.close()
    srv.close()


@pytest.mark.slow
def test_5_database_url_on_a_port_that_never_answers_is_refused_in_seconds(silent_port: int, tmp_path: Path) -> None:
    env = {**os.environ, "GGPO_DB_URL": f"postgresql://postgres@127.0.0.1:{silent_port}/x",
           "GGPO_DATA_DIR": str(tmp_path), "GGPO_USER": "t"}
    t0 = time.monotonic()
    line = assert_one_line_process(run_subprocess(["status"], env, timeout=60), 4)
    took = time.monotonic() - t0
    assert took < 20 and "timeout" in line, (took, line)
    print(f"\nGGPO_DB_URL on a silent port: refused in {took:.1f} s: {line}")


def test_5_import_of_a_fifo_or_a_device_is_refused_before_reading(upgraded: dict[str, str], tmp_path: Path) -> None:
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    env = {**os.environ}
    for path in (str(fifo), "/dev/zero"):
        t0 = time.monotonic()
        line = assert_one_line_process(run_subprocess(["ledger", "import", path], env, timeout=30), 2)
        assert "not a regular file" in line and time.monotonic() - t0 < 20, line
    spec_line = assert_one_line_process(run_subprocess(["enqueue", str(fifo), "--dry-run"], env, timeout=30), 2)
    assert "not a regular file" in spec_line


def test_5_import_file_over_the_size_limit_is_refused_before_reading(upgraded: dict[str, str], tmp_path: Path) -> None:
    from ggpo_batch.common import limits

    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate(limits.RESULTS_MAX_BYTES + 1)  # sparse: no disk, no memory
    assert_refused(run_cli("ledger", "import", str(big)), 2, says=f"at most {limits.RESULTS_MAX_BYTES}")


@pytest.mark.parametrize("case", ["array 100,000 deep", "object 100,000 deep", "5,000-digit integer", "1e999"])
def test_5_deep_nesting_and_huge_numbers_are_refused(upgraded: dict[str, str], tmp_path: Path, case: str) -> None:
    def placeholder(rec: dict[str, Any]) -> None:
        rec["training"]["cost_limitations"] = "__HOSTILE__"  # a field the record schema does not type-check

    value = {
        "array 100,000 deep": "[" * 100_000 + "]" * 100_000,
        "object 100,000 deep": '{"a":' * 100_000 + "1" + "}" * 100_000,
        "5,000-digit integer": "9" * 5000,
        "1e999": "1e999",
    }[case]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(one_record(placeholder)).replace('"__HOSTILE__"', value))
    before = fingerprint(upgraded["GGPO_DB_URL"])
    assert_refused(run_cli("ledger", "import", str(path)), 2)
    spec = tmp_path / "deep.toml"
    spec.write_text(SPEC.format(name="deep") + "[train]\nx = " + "[" * 50_000 + "]" * 50_000 + "\n")
    assert_refused(run_cli("enqueue", str(spec), "--dry-run"), 2)
    spec.write_text(SPEC.format(name="big").replace("seeds = [1, 2]", "seeds = [" + "9" * 5000 + "]"))
    assert_refused(run_cli("enqueue", str(spec), "--dry-run"), 2)
    assert fingerprint(upgraded["GGPO_DB_URL"]) == before


# -- 6. secrets ------------------------------------------------------------------------------------------------

RESERVED = ":/?#[]@!$&'()*+,;=% "


@pytest.mark.parametrize("char", list(RESERVED), ids=[f"{ord(c):02x}" for c in RESERVED])
def test_6_passwords_with_every_reserved_character_are_never_printed(char: str, tmp_path: Path) -> None:
    """Raw or percent-encoded, a password holding any reserved character stays out of every error."""
    from urllib.parse import quote

    from ggpo_batch.config.secrets import redact

    password = f"Qx{char}Zk7{char}Wv9"
    pieces = [p for p in password.split(char) if p]
    closed = free_port()
    ledger_env = {"GGPO_DATA_DIR": str(tmp_path), "GGPO_USER": "t", "GGPO_DB_URL": f"sqlite:///{tmp_path}/l.db",
                  "GGPO_REDIS_URL": "memory://"}
    assert run_cli("db", "upgrade", env=ledger_env).exit_code == 0
    for written in (password, quote(password, safe="")):
        for scheme in ("postgresql", "redis"):
            url = f"{scheme}://ggpo:{written}@127.0.0.1:{closed}/0"
            env = {**ledger_env, "GGPO_DB_URL" if scheme == "postgresql" else "GGPO_REDIS_URL": url}
            res = run_cli("status" if scheme == "postgresql" else "reconcile", env=env)
            line = assert_refused(res, 2 if written == password and char in "/?#[]@ " else 4)
            shown = res.output + redact(f"failed: {url} ({url!r})")
            for piece in [password, written, *pieces]:
                assert piece not in shown, (written, line)
            assert "Qx" not in line, line


def test_6_redaction_is_a_parse_not_a_pattern() -> None:
    from ggpo_batch.config.secrets import redact

    msg = "redis://:a@b@h:1/0 and postgresql+psycopg://u:p:q@h/db?x=1 and sqlite:////tmp/a@b/l.db failed"
    out = redact(msg)
    assert "a@b@h" not in out and "b@h" not in out.split("and")[0] and "p:q" not in out
    assert "sqlite:////tmp/a@b/l.db" in out  # a file path is not a password


# -- 7. small ones ----------------------------------------------------------------------------------------------


def test_7_decide_refuses_an_empty_name(upgraded: dict[str, str]) -> None:
    before = fingerprint(upgraded["GGPO_DB_URL"])
    for name in ("", " ", "a b", "a/b", "_lead"):
        assert_refused(run_cli("decide", name, "--not-reproduced", "--reason", "r", "--cost-basis", "c"), 2,
                       says="EXPERIMENT")
    assert fingerprint(upgraded["GGPO_DB_URL"]) == before


def test_7_cancel_without_arguments_says_what_to_give(upgraded: dict[str, str]) -> None:
    line = assert_refused(run_cli("cancel"), 2)
    assert "not both" not in line and "RUN_KEY or --experiment" in line
    assert "not both" in assert_refused(run_cli("cancel", "k", "-e", "x"), 2)


def test_7_export_into_a_folder_that_cannot_be_written_is_one_line(upgraded: dict[str, str], tmp_path: Path) -> None:
    assert_refused(run_cli("ledger", "export", "--format", "csv", "-o", "/proc/ggpo-export.csv"), 2,
                   says="cannot write")
    assert_refused(run_cli("ledger", "export", "--format", "csv", "-o", str(tmp_path / "no" / "such" / "x.csv")), 2,
                   says="cannot write")


@pytest.mark.parametrize("args", [["enqueue"], ["nosuch"], ["status", "--bogus"], ["retry", "k"],
                                  ["status", "--nights", "0"], ["-q"]])
def test_7_usage_errors_are_one_line(args: list[str]) -> None:
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ggpo-batch") and "--help" in lines[0], res.stderr


def test_limits_are_read_from_the_schema() -> None:
    from ggpo_batch.common import limits
    from ggpo_batch.ledger.schema import Event, Run

    assert limits.ARM_NAME_MAX == Run.arm.property.columns[0].type.length
    assert limits.USER_MAX == Event.actor.property.columns[0].type.length
    assert limits.SEED_MAX == 2**63 - 1
