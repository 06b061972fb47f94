"""Secrets and hostile input: passwords only from env or a 0600 file and never printed; a TLS,
password-protected Redis works; names cannot reach sbatch or a shell unsanitised; the ledger
records who submitted."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.common.netutil import free_port
from ggpo_batch.config.secrets import redact
from ggpo_batch.config.settings import load_settings
from ggpo_batch.errors import ConfigError
from ggpo_batch.executor.base import job_name

REDIS_PW = "pw-Zx81-not-for-print"
DB_PW = "db-Qq27-not-for-print"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A private redis-server with TLS only and a password, on loopback."""
    if not (shutil.which("openssl") and shutil.which("redis-server")):
        pytest.skip("needs openssl and redis-server")
    d = tmp_path_factory.mktemp("tls")
    port = free_port()

    def run(*args: str) -> None:
        subprocess.run(args, cwd=d, check=True, capture_output=True)

    run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
        "-subj", "/CN=ggpo-test-ca")
    run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "r.key", "-out", "r.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", "r.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "r.crt", "-days", "1", "-extfile", "ext")
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", "r.crt", "--tls-key-file", "r.key", "--tls-ca-cert-file", "ca.crt",
                             "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--requirepass", REDIS_PW],
                            cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"rediss://:{REDIS_PW}@127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}&ssl_cert_reqs=required"
    import redis

    for _ in range(50):
        try:
            redis.Redis.from_url(url).ping()
            break
        except Exception:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_tls_password_redis_works_and_no_password_is_printed(env, tls_redis: str, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from ggpo_batch.control.queue import RunQueue

    secret_file = tmp_path / "redis-url"
    secret_file.write_text(tls_redis + "\n")
    secret_file.chmod(0o600)
    monkeypatch.setenv("GGPO_REDIS_URL_FILE", str(secret_file))
    runner = CliRunner()
    assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0
    spec = tmp_path / "s.toml"
    spec.write_text('[experiment]\nname = "sec"\nmethod = "ggpo"\nseeds = [1]\nexecutor = "debug"\n'
                    '[arms.clean]\nexposure = "none"\n')
    res = runner.invoke(cli, ["-vv", "enqueue", str(spec), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert RunQueue.from_url(tls_redis, "ggpo").waiting() == {"sec-v1-1-clean": 1}
    outputs = [res.output]
    for args in (["status"], ["status", "--json"], ["-vv", "reconcile", "--json"], ["db", "current", "--json"]):
        r = runner.invoke(cli, args, catch_exceptions=False)
        assert r.exit_code == 0, (args, r.output)
        outputs.append(r.output)
    # a wrong password: one error line, and neither password in it
    bad = tls_redis.replace(REDIS_PW, "wrong-" + REDIS_PW)
    secret_file.write_text(bad)
    r = runner.invoke(cli, ["reconcile"], catch_exceptions=False)
    assert r.exit_code == 4 and r.output.count("\n") == 1, r.output
    outputs.append(r.output)
    for text in outputs:
        assert REDIS_PW not in text


def test_secret_files_must_be_0600(tmp_path: Path) -> None:
    f = tmp_path / "db-url"
    f.write_text(f"postgresql://ggpo:{DB_PW}@127.0.0.1:5432/test")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="must be 0600") as err:
        load_settings({"GGPO_DB_URL_FILE": str(f), "GGPO_DATA_DIR": str(tmp_path)})
    assert DB_PW not in str(err.value)
    f.chmod(0o600)
    assert DB_PW in load_settings({"GGPO_DB_URL_FILE": str(f), "GGPO_DATA_DIR": str(tmp_path)}).db_url


def test_database_password_is_never_printed(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("the password matters on PostgreSQL")
    with_pw = db_url.replace("postgres@", f"postgres:{DB_PW}@")  # trust auth: accepted, and must stay hidden
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("GGPO_DB_URL", with_pw)
    monkeypatch.setenv("GGPO_DATA_DIR", str(tmp_path))
    runner = CliRunner()
    outs = [runner.invoke(cli, ["-vv", "db", "upgrade"], catch_exceptions=False).output,
            runner.invoke(cli, ["db", "current", "--json"], catch_exceptions=False).output,
            runner.invoke(cli, ["status", "--json"], catch_exceptions=False).output]
    monkeypatch.setenv("GGPO_DB_URL", with_pw.rsplit("/", 1)[0] + "/no_such_db_ggpo")
    err = runner.invoke(cli, ["status"], catch_exceptions=False)
    assert err.exit_code == 4
    outs.append(err.output)
    for text in outs:
        assert DB_PW not in text
    assert "postgres:***@" in outs[1]


@pytest.mark.parametrize("key", ['a"b', "a'b", "a;rm -rf /", "$(reboot)", "a`id`", "a\nb", "a b", "../../etc/passwd",
                                 "x" * 500, "\u00e9\u2603"])
def test_hostile_run_keys_are_sanitised_before_sbatch(key: str) -> None:
    name = job_name(key, 1)
    assert all(c.isalnum() or c in "_.-" for c in name) and len(name) <= 200
    assert "\n" not in name and "$" not in name and ";" not in name


def test_redact_covers_every_url_in_a_message() -> None:
    msg = f"redis://:{REDIS_PW}@h:1/0 and postgresql+psycopg://u:{DB_PW}@h/db failed"
    out = redact(msg)
    assert REDIS_PW not in out and DB_PW not in out and "u:***@" in out


def test_ledger_records_the_submitting_user(ledger, settings, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from ggpo_batch.control.enqueue import enqueue_spec
    from ggpo_batch.spec.parse import load_spec

    spec = tmp_path / "s.toml"
    spec.write_text('[experiment]\nname = "who"\nmethod = "ggpo"\nseeds = [1]\nexecutor = "debug"\n'
                    '[arms.clean]\nexposure = "none"\n')
    enqueue_spec(ledger, settings, load_spec(spec), actor="dora")
    [exp] = ledger.experiments("who")
    assert exp.created_by == "dora"
    assert {e.actor for e in ledger.events(experiment_id=exp.id)} == {"dora"}
    att = ledger.begin_attempt("who-v1-1-clean", executor="debug", gpus=4, actor="dora", worker="w")
    assert att.submitted_by == "dora"
