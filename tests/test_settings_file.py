"""The settings files: the site's and the user's config.toml (or GGPO_CONFIG's) under the
environment, read into the mapping load_settings reads; unknown keys, secrets and bad values
refused naming the file and key (exit 2); `ggpo-batch config` shows each setting's value and source."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggpo_batch.cli import cli
from ggpo_batch.config import settings as config
from ggpo_batch.config.files import layered_environment
from ggpo_batch.config.settings import Settings, load_settings, setting_names
from ggpo_batch.config.settings_view import effective_settings


@pytest.fixture
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No GGPO_ variable but a data dir and a user; the user's config folder under tmp_path."""
    for k in list(os.environ):
        if k.startswith("GGPO_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    values = {"GGPO_DATA_DIR": str(tmp_path / "data"), "GGPO_USER": "tester"}
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    return values


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    return res.exit_code, res.stdout, res.stderr


def test_the_environment_beats_the_user_file_which_beats_the_sites(clean_env: dict[str, str], tmp_path: Path) -> None:
    site = tmp_path / "site"
    _write(site / "config.toml", 'queue = "site-q"\nqueue_gpu_quota = 2\ndefer_seconds = 7\n'
                                 'user_gpu_hours_cap = 10.5\n[notify]\nsmtp_host = "mail.site"\n'
                                 'email_to = ["ops@example.org", "ml@example.org"]\nsmtp_starttls = true\n')
    user_dir = tmp_path / "xdg" / "ggpo-batch"
    _write(user_dir / "secret" / "db", f"sqlite:///{tmp_path / 'from-secret.sqlite3'}\n", 0o600)
    _write(user_dir / "config.toml", 'queue = "user-q"\ndb_url_file = "secret/db"\n[notify]\nsmtp_port = 2525\n')
    env = {**os.environ, "GGPO_QUEUE_GPU_QUOTA": "5", "GGPO_DEFER_SECONDS": ""}
    s = load_settings(layered_environment(env, setting_names, site_dir=site))
    assert (s.queue, s.queue_gpu_quota, s.defer_seconds, s.user_gpu_hours_cap) == ("user-q", 5, 7, 10.5)
    assert s.db_url == f"sqlite:///{tmp_path / 'from-secret.sqlite3'}"  # the path relative to the user file
    n = s.notify
    assert (n.smtp_host, n.smtp_port, n.smtp_starttls, n.email_to) == ("mail.site", 2525, True,
                                                                         ("ops@example.org", "ml@example.org"))
    # A secret and its _FILE twin are one setting: the environment's GGPO_DB_URL beats the file's db_url_file.
    s = load_settings(layered_environment({**env, "GGPO_DB_URL": "sqlite:///env.sqlite3"}, setting_names,
                                          site_dir=site))
    assert s.db_url == "sqlite:///env.sqlite3"
    # With no environment given, load_settings reads the user's file itself (XDG_CONFIG_HOME), as every command does.
    assert load_settings().queue == "user-q"
    assert _cli("db", "upgrade")[0] == 0 and (tmp_path / "from-secret.sqlite3").exists()
    # GGPO_CONFIG names the one file read: neither the user's nor the site's.
    only = _write(tmp_path / "team.toml", 'queue = "team-q"\n')
    s = load_settings(layered_environment({**env, "GGPO_CONFIG": str(only)}, setting_names, site_dir=site))
    assert (s.queue, s.defer_seconds, s.notify.smtp_host) == ("team-q", 30, None)


BAD = [
    ('queu = "x"\n', "unknown key 'queu' (it would set GGPO_QUEU, which no setting reads"),
    ('[notify]\nsmtp_hots = "x"\n', "unknown key 'notify.smtp_hots'"),
    ('queue_gpu_quota = "many"\n', "queue_gpu_quota='many': must be an integer"),
    ('hung_after_seconds = -1\n', "hung_after_seconds='-1': must be a number above 0 and at most 2,592,000"),
    ('[notify]\nsmtp_port = 70000\n', "notify.smtp_port='70000': must be between 1 and 65535"),
    ('[notify]\nwebhook_events = ["run_failed", "run_exploded"]\n',
     "notify.webhook_events='run_failed,run_exploded': unknown event(s) run_exploded"),
    ('db_url = "postgresql://ggpo:hunter22@db.example.org/ledger"\n',
     ("db_url: a secret is not kept in a settings file; put it in a file only you can read (chmod 600) and name "
      "that file with db_url_file")),
    ('dashboard_token = "0123456789abcdef0123"\n',
     "dashboard_token: a secret is not kept in a settings file; set GGPO_DASHBOARD_TOKEN in the environment instead"),
    ('[notify]\nwebhook_urls = ["https://hooks.slack.com/services/T0/B0/XXXX"]\n',
     "notify.webhook_urls: a secret is not kept in a settings file; put it in a file"),
    ('queue = \n', "not valid TOML"),
    ('queue = 2026-12-01\n', "queue: date is not a setting's value"),
    ('db_url_file = "missing"\n', "db_url_file=DIR/missing: cannot read (No such file or directory)"),
]


@pytest.mark.parametrize("text,problem", BAD)
def test_a_bad_settings_file_is_refused_naming_file_and_key(clean_env: dict[str, str], tmp_path: Path, text: str,
                                                            problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "cfg" / "config.toml", text)
    monkeypatch.setenv("GGPO_CONFIG", str(path))
    code, out, err = _cli("config")
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith(f"error: {path}: ") and problem.replace("DIR", str(path.parent)) in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "hunter22" not in err
    assert _cli("status")[0] == 2, "every command reads the settings file"


def test_a_missing_named_file_and_an_environment_value_are_named_as_such(clean_env: dict[str, str], tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GGPO_CONFIG", str(tmp_path / "nope.toml"))
    assert _cli("config")[0:3:2] == (2, f"error: GGPO_CONFIG={tmp_path / 'nope.toml'}: no such file\n")
    path = _write(tmp_path / "ok.toml", 'queue_gpu_quota = 3\n')
    monkeypatch.setenv("GGPO_CONFIG", str(path))
    monkeypatch.setenv("GGPO_QUEUE_GPU_QUOTA", "lots")  # the environment's value is the bad one: named as such
    assert _cli("config")[0:3:2] == (2, "error: GGPO_QUEUE_GPU_QUOTA='lots': must be an integer from 0 to 1,000,000\n")


def test_config_shows_every_setting_with_its_source_and_no_secret(clean_env: dict[str, str], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _write(tmp_path / "cfg" / "smtp-password", "s3cret-smtp-pw\n", 0o600)
    path = _write(tmp_path / "cfg" / "config.toml", 'queue = "team-q"\n[notify]\nsmtp_host = "mail.example.org"\n'
                  'email_to = "ml@example.org"\nsmtp_user = "batch"\nsmtp_password_file = "smtp-password"\n')
    monkeypatch.setenv("GGPO_CONFIG", str(path))
    monkeypatch.setenv("GGPO_REDIS_URL", "redis://:r3dis-pw@cache.example.org:6379/0")
    monkeypatch.setenv("GGPO_NOTIFY_WEBHOOK_URLS", "https://hooks.slack.com/services/T0/B0/t0ken-in-path")
    monkeypatch.setenv("GGPO_DASHBOARD_TOKEN", "0123456789abcdef0123")
    code, out, err = _cli("config", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["schema"] == 1 and doc["files"] == [{"path": str(path), "role": "GGPO_CONFIG", "found": True}]
    rows = {r["name"]: r for r in doc["settings"]}
    assert rows["GGPO_QUEUE"] == {"name": "GGPO_QUEUE", "key": "queue", "value": "team-q", "source": "file",
                                  "set_by": "queue", "file": str(path)}
    assert rows["GGPO_USER"]["source"] == "env" and rows["GGPO_USER"]["set_by"] == "GGPO_USER"
    assert rows["GGPO_QUEUE_GPU_QUOTA"] == {"name": "GGPO_QUEUE_GPU_QUOTA", "key": "queue_gpu_quota", "value": 0,
                                            "source": "default", "set_by": None, "file": None}
    assert rows["GGPO_NOTIFY_SMTP_PASSWORD"]["value"] == "***"
    assert rows["GGPO_NOTIFY_SMTP_PASSWORD"]["set_by"] == "notify.smtp_password_file"
    assert rows["GGPO_NOTIFY_WEBHOOK_URLS"]["value"] == "***"
    assert rows["GGPO_DASHBOARD_TOKEN"]["value"] == "***" and rows["GGPO_DASHBOARD_TOKEN"]["source"] == "env"
    assert rows["GGPO_REDIS_URL"]["value"] == "redis://:***@cache.example.org:6379/0"
    assert rows["GGPO_NOTIFY_EMAIL_TO"]["value"] == ["ml@example.org"]
    code, text, err = _cli("config")
    assert code == 0 and f"file {path} (queue)" in text and "env GGPO_REDIS_URL" in text
    for shown in (out, text):
        for secret_text in ("s3cret-smtp-pw", "r3dis-pw", "t0ken-in-path", "0123456789abcdef0123"):
            assert secret_text not in shown, secret_text
    assert secret.exists()


def _fields(cls: type, prefix: str = "GGPO_") -> set[str]:
    """The variable of each Settings field: GGPO_<FIELD>, a nested dataclass's with its name."""
    out = set()
    for f in dataclasses.fields(cls):
        if f.name in config.DERIVED_FIELDS:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            out |= _fields(type(default), f"{prefix}{f.name.upper()}_")
        else:
            out.add(f"{prefix}{f.name.upper()}")
    return out


def test_every_setting_is_known_to_the_settings_file() -> None:
    """Each GGPO_ name config.py reads, and each Settings field, is a key a settings file may hold
    (and `ggpo-batch config` finds its source): a setting added under another name fails here."""
    known = setting_names()
    # GGPO_CONFIG names the file itself (the image digest, read by the job alone, is allocation.py's).
    named = set(re.findall(r'"(GGPO_[A-Z0-9_]+)"', Path(config.__file__).read_text())) - {"GGPO_CONFIG"}
    assert named and named <= known, named - known
    assert {"GGPO_NOTIFY_SMTP_HOST", "GGPO_NOTIFY_SMTP_PASSWORD_FILE", "GGPO_DB_URL_FILE"} <= known
    unknown = _fields(Settings) - known
    assert not unknown, f"Settings fields with no GGPO_ variable of their name: {unknown}"


def test_a_planted_setting_the_file_cannot_know_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks above on planted defects: a field read under another name, a reader that stops asking."""

    @dataclasses.dataclass(frozen=True)
    class Planted(Settings):
        gpus_per_role: int = 0  # read (say) from GGPO_ROLE_GPUS: not its name

    assert _fields(Planted) - setting_names() == {"GGPO_GPUS_PER_ROLE"}
    monkeypatch.setattr(config, "dashboard_token", lambda env=None: None)
    assert "GGPO_DASHBOARD_TOKEN" not in setting_names()


def test_effective_settings_of_a_given_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    doc = effective_settings({"GGPO_DATA_DIR": str(tmp_path), "GGPO_USER": "u", "GGPO_QUEUE": "q"})
    rows = {r["name"]: r for r in doc["settings"]}
    assert rows["GGPO_QUEUE"]["value"] == "q" and rows["GGPO_QUEUE"]["source"] == "env"
    assert rows["GGPO_DB_URL"]["value"] == f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    assert rows["GGPO_DB_URL"]["source"] == "default"
    assert [f["role"] for f in doc["files"]] == ["site", "user"] and not doc["files"][1]["found"]


@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664, 0o620])
def test_a_settings_file_others_may_write_is_refused_naming_file_and_fix(clean_env: dict[str, str], tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         mode: int) -> None:
    """It decides where the ledger, the queue and the notifications go: group- or world-writable is refused
    (exit 2, one line naming the file and `chmod go-w`), read from GGPO_CONFIG and from the user's folder."""
    named = _write(tmp_path / "team.toml", 'queue = "team-q"\n', mode)
    monkeypatch.setenv("GGPO_CONFIG", str(named))
    code, out, err = _cli("config")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, out, err)
    assert err == f"error: {named}: writable by others than its owner (mode {mode:04o}); a settings file decides " \
                  f"where the ledger, the queue and the notifications go: chmod go-w {named}\n", err
    monkeypatch.delenv("GGPO_CONFIG")
    user = _write(tmp_path / "xdg" / "ggpo-batch" / "config.toml", 'queue = "user-q"\n', mode)
    assert _cli("status")[0] == 2 and f"{user}: writable by others" in _cli("status")[2]
    user.chmod(0o644)  # owner-writable only: read as before
    assert load_settings().queue == "user-q"
