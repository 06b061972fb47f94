"""docs/reference/settings.md: every `GGPO_*` setting the commands read (`config.setting_names()`),
its settings-file key, its default as `ggpo-batch config` shows it on an empty environment, and its
meaning (below); then the variables read from the environment only and those ggpo-batch sets for its
jobs. A setting the code reads without a meaning here, or a `GGPO_` name in the package that this
page does not list, stops the page from being written (`problems`)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from ggpo_batch.common.datafiles import PACKAGE_DIR
from ggpo_batch.config.files import is_secret
from ggpo_batch.config.settings import setting_names
from ggpo_batch.config.settings_view import effective_settings

GENERATED = ("<!-- Generated from ggpo_batch/config/settings.py (the settings it reads and their defaults) and "
             "tools/docs/settings_md.py (their meanings) by `python tools/docs/reference.py`; tests/test_docs.py "
             "fails when it is stale. -->")

# Each setting's meaning; a default in words where `ggpo-batch config` would show this machine's value.
SETTINGS: dict[str, tuple[str, str | None]] = {
    "GGPO_DB_URL": ("the ledger; `postgresql://user@host/db` for a team", "`sqlite:///<user data dir>/ledger.sqlite3`"),
    "GGPO_DB_URL_FILE": ("read `GGPO_DB_URL` (with its password) from a file of mode 0600", None),
    "GGPO_REDIS_URL": ("the queue; `rediss://…?ssl_ca_certs=…` for TLS; `memory://` runs jobs inline", None),
    "GGPO_REDIS_URL_FILE": ("read `GGPO_REDIS_URL` (with its password) from a file of mode 0600", None),
    "GGPO_DATA_DIR": ("SQLite file, job folders (`jobs/<run>/attempt-N/`), nightly records", "user data dir"),
    "GGPO_QUEUE": ("default queue name", None),
    "GGPO_QUEUE_GPU_QUOTA": (("most GPUs a queue may have in flight (0: no limit); over it a run is deferred, not "
                             "failed"), None),
    "GGPO_USER_GPU_QUOTA": ("most GPUs one person's runs may have in flight (0: no limit)", None),
    "GGPO_ROLE_GPU_QUOTA": (("the same per PostgreSQL role, e.g. `ggpo_lead=16,ggpo_member=8` (the largest of the "
                            "person's roles applies)"), None),
    "GGPO_DEFER_SECONDS": ("how long a deferred run waits before it is tried again", None),
    "GGPO_USER_GPU_HOURS_CAP": ("cost cap per user (GPU-hours)", None),
    "GGPO_QUEUE_GPU_HOURS_CAP": ("cost cap per queue (GPU-hours)", None),
    "GGPO_USER": ("whom you act as: only a service role, the ledger's owner or a superuser may name someone else",
                  "you (the login name)"),
    "GGPO_HUNG_AFTER_SECONDS": ("a running run silent (no heartbeat) for longer is flagged hung in `status`", None),
    "GGPO_DASHBOARD_TOKEN": ("required by `dashboard --host` other than 127.0.0.1; then every request carries it",
                             None),
    "GGPO_LOG_FORMAT": (("`text`, or `json`: one JSON object a log line (time, level, logger, message, run key, "
                         "attempt, job id), for commands, workers, their jobs and the nightly tier"), None),
    "GGPO_MLFLOW_URI": ("MLflow tracking store of every attempt, e.g. `sqlite:///srv/mlflow/mlflow.db`", "none (off)"),
    "GGPO_FAULT_PAUSE": (("fault injection for the fault suite: `POINT=SECONDS` a worker sleeps at a named point "
                         "of a submission (tests only)"), None),
    "GGPO_NOTIFY_WEBHOOK_URLS": (("webhooks (comma-separated): a POST of `{\"text\", \"kind\", \"key\", "
                                 "\"created_at\", \"fields\", \"schema\"}` (Slack-compatible)"), None),
    "GGPO_NOTIFY_WEBHOOK_URLS_FILE": ("the webhooks from a 0600 file, one a line", None),
    "GGPO_NOTIFY_WEBHOOK_EVENTS": ("which kinds of notification the webhooks get", None),
    "GGPO_NOTIFY_SMTP_HOST": ("the e-mail relay", None),
    "GGPO_NOTIFY_SMTP_PORT": ("its port", None),
    "GGPO_NOTIFY_SMTP_STARTTLS": ("STARTTLS to the relay", None),
    "GGPO_NOTIFY_SMTP_USER": ("relay user (with the password)", None),
    "GGPO_NOTIFY_SMTP_PASSWORD": ("relay password", None),
    "GGPO_NOTIFY_SMTP_PASSWORD_FILE": ("the relay password from a 0600 file", None),
    "GGPO_NOTIFY_EMAIL_FROM": ("sender", None),
    "GGPO_NOTIFY_EMAIL_TO": ("recipients (comma-separated)", None),
    "GGPO_NOTIFY_EMAIL_EVENTS": ("which kinds of notification e-mail gets", None),
    "GGPO_NOTIFY_TIMEOUT_SECONDS": ("longest wait for a sink (connect, each read)", None),
    "GGPO_NOTIFY_RETRY_SECONDS": ("first pause after a failed try (doubling, at most an hour)", None),
    "GGPO_NOTIFY_GIVE_UP_SECONDS": ("the delivery is given up this long after the event", None),
    "GGPO_NOTIFY_MAX_PER_PASS": ("notifications one reconcile pass sends", None),
}
# Read from the environment only (never from a settings file).
ENVIRONMENT_ONLY = {
    "GGPO_CONFIG": "read this one settings file instead of the site's and the user's",
    "GGPO_IMAGE_DIGEST": "the digest of the image the allocation runs (e.g. `sha256:...`), set in the workers' "
                         "environment; recorded in each attempt's provenance",
    "GGPO_RANK_SERVER": "`off` starts each rank of a local job as its own interpreter, importing torch, DeepSpeed "
                        "and the trainer itself, and each rank of a local run (`ggpo-batch train`) from a fork server "
                        "of the launching process's own (default: forked by the machine's rank server, which imported "
                        "them once; ggpo_batch/common/rank_client.py)",
    "GGPO_RANK_SERVER_IDLE_SECONDS": "a rank server ends after this long without a live rank (default 600)",
    "GGPO_CANARY_FAULT": "tests only: a defect planted in a canary job's checks (`push_skips_layer`, "
                         "`reduction_differs`, `probe_over_ceiling`; ggpo_batch/train/run/canary.py), each making "
                         "its own check fail",
}
# Set by ggpo-batch in a job's environment (the batch script exports them; ggpo_batch/contracts/allocation.py).
FOR_JOBS = {
    "GGPO_ALLOC_START": "the allocation's start (epoch seconds), so the job's own GPU-hours include interpreter "
                        "and torch start-up, as the scheduler's do",
    "GGPO_TIME_LIMIT_S": "the allocation's time limit (seconds): the job's save deadline is start + limit - delay",
    "GGPO_SIGNAL_DELAY_S": "the profile's signal delay (seconds)",
    "GGPO_LONE_RANK_PORT": "the rendezvous port a job alone in its process chose for itself (a later job in the "
                           "process, or a child, takes a fresh one instead of reusing it)",
    "GGPO_RANK_SERVER_PRELOAD": "what the rank server forking a local run's rank imports besides torch, DeepSpeed "
                                "and the trainer: `vllm` for a run with vLLM rollouts (ggpo_batch/common/rank_client.py)",
}
_NAME = re.compile(r"\"(GGPO_[A-Z0-9_]*[A-Z0-9])\"")


def names_in_package() -> set[str]:
    """Every `"GGPO_..."` string literal of the package's sources."""
    return {m for path in PACKAGE_DIR.rglob("*.py") for m in _NAME.findall(path.read_text())}


def problems() -> list[str]:
    """What keeps the page from saying every setting: names read without a meaning here, meanings of
    names no longer read, `GGPO_` names of the package the page does not list."""
    read = setting_names()
    listed = set(SETTINGS) | set(ENVIRONMENT_ONLY) | set(FOR_JOBS)
    out = [f"{n}: read by ggpo_batch/config/settings.py, no meaning in tools/docs/settings_md.py" for n in sorted(read - set(SETTINGS))]
    out += [f"{n}: in tools/docs/settings_md.py, no longer a setting" for n in sorted(set(SETTINGS) - read)]
    out += [f"{n}: a GGPO_ name of the package that tools/docs/settings_md.py does not list"
            for n in sorted(names_in_package() - listed)]
    return out


def _defaults() -> dict[str, Any]:
    """Each setting's value on an empty environment and no settings file, as `ggpo-batch config` shows it."""
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "config.toml"
        empty.write_text("")
        rows = effective_settings({"GGPO_CONFIG": str(empty)})["settings"]
    return {r["name"]: r["value"] for r in rows}


def _shown(value: Any) -> str:
    if value is None or value == []:
        return "none"
    if isinstance(value, bool):
        return f"`{'true' if value else 'false'}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list):
        value = ",".join(map(str, value))
    return f"`{value}`"


def _key(name: str) -> str:
    """The settings-file key: `[notify] smtp_host` for GGPO_NOTIFY_SMTP_HOST, `queue` for GGPO_QUEUE;
    none for a secret (refused in a settings file)."""
    if is_secret(name):
        return "(environment only)"
    key = name.removeprefix("GGPO_").lower()
    if key.startswith("notify_"):
        return f"`[notify] {key.removeprefix('notify_')}`"
    return f"`{key}`"


def markdown() -> str:
    found = problems()
    if found:
        raise SystemExit("tools/docs/settings_md.py: " + "; ".join(found))
    defaults = _defaults()
    lines = ["# Settings reference", "", GENERATED, "",
             ("Every setting the commands read. Each is an environment variable, or a key of a settings file "
             "(`/etc/ggpo-batch/config.toml`, then `~/.config/ggpo-batch/config.toml`, then the environment, each "
             "overriding the one before; [the operator's guide](../operator.md#settings-file) says more). A secret "
             "(a password, a token, webhook URLs, a URL with a password) is refused in a settings file: its "
             "`_FILE` twin names a file of mode 0600 that holds it. `ggpo-batch config` prints each setting as "
             "the commands use it, with its source. Numeric settings are bounded ([limits](../limits.md))."), "",
             "## Settings", "", "| variable | settings-file key | default | meaning |", "| --- | --- | --- | --- |"]
    for name, (meaning, default) in SETTINGS.items():
        lines.append(f"| `{name}` | {_key(name)} | {default or _shown(defaults.get(name))} | {meaning} |")
    lines += ["", "## Environment only", "", "| variable | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in ENVIRONMENT_ONLY.items()]
    lines += ["", "## Set by ggpo-batch for its jobs", "",
              "The batch script of an allocation exports these for the training job; nobody sets them by hand.", "",
              "| variable | meaning |", "| --- | --- |"]
    lines += [f"| `{name}` | {meaning} |" for name, meaning in FOR_JOBS.items()]
    lines.append("")
    return "\n".join(lines)
