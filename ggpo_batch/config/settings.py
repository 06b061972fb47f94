"""Settings from the environment: the one module that reads env vars.

Secrets (database and Redis URLs with passwords) come from the environment or from a file with
0600 permissions (`GGPO_DB_URL_FILE`, `GGPO_REDIS_URL_FILE`); `redact()` keeps them out of output.
The settings files (`settings_file.py`: ~/.config/ggpo-batch/config.toml, /etc/ggpo-batch/config.toml
or GGPO_CONFIG) hold the same settings under the environment: `environment()` layers them.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..common import limits
from ..common.datafiles import APP_NAME
from ..contracts.heartbeat import HUNG_AFTER_SECONDS
from ..errors import ConfigError
from .notify_targets import NotifyTargets, notify_targets
from .secrets import remember, remember_password, remember_secret

MEMORY_REDIS = "memory://"  # embedded quick start: fakeredis, jobs run inline in the caller


def _data_dir(env: Mapping[str, str]) -> Path:
    if env.get("GGPO_DATA_DIR"):
        return Path(env["GGPO_DATA_DIR"]).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME, appauthor=False))


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """`NAME` from env, else the contents of the file named by `NAME_FILE`, which must be 0600 and
    a regular file (a FIFO would block, a device never end)."""
    if env.get(name):
        return _url(name, env[name].strip())
    path = env.get(f"{name}_FILE")
    if not path:
        return None
    return _url(name, private_file_text(f"{name}_FILE", path))


def private_file_text(setting: str, path: str) -> str:
    """The text (stripped) of the secrets file `path` named by `setting`: a regular file with 0600
    permissions, small, UTF-8."""
    from ..common import limits

    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"{setting}={path}: cannot read ({exc.strerror})") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"{setting}={path}: permissions {stat.S_IMODE(st.st_mode):04o}; must be 0600 (chmod 600)")
    try:
        raw = limits.read_input_file(p, max_bytes=limits.SECRET_FILE_MAX_BYTES, what="secrets file")
    except limits.InputRefused as exc:
        raise ConfigError(f"{setting}={path}: {exc.problem}") from None
    try:
        return raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{setting}={path}: is not UTF-8 text") from None


def _url(name: str, url: str) -> str:
    """A service URL from the environment, checked (the message never shows it) and its password
    remembered, so that `redact` hides it wherever it appears."""
    remember_password(url)  # even when refused below: a later message might still quote it
    problem = limits.url_problem(url) or limits.text_problem(url, single_line=True)
    if problem:
        raise ConfigError(f"{name}: {problem}")
    return url


# The range of every numeric setting (inclusive; the hung threshold must be above 0): a value outside,
# an infinity, NaN or a number too long to read is refused when the settings are read, with one line.
# Above these, the code that uses them would overflow a date or a sleep (1e12 s is 31,700 years).
DAY_SECONDS = 86400
NUMBER_BOUNDS: dict[str, tuple[float, float]] = {
    "GGPO_QUEUE_GPU_QUOTA": (0, 1_000_000),  # GPUs
    "GGPO_USER_GPU_QUOTA": (0, 1_000_000),  # GPUs
    "GGPO_ROLE_GPU_QUOTA": (0, 1_000_000),  # GPUs, of each ROLE=GPUS
    "GGPO_DEFER_SECONDS": (0, 7 * DAY_SECONDS),
    "GGPO_USER_GPU_HOURS_CAP": (0, limits.GPU_HOURS_MAX),
    "GGPO_QUEUE_GPU_HOURS_CAP": (0, limits.GPU_HOURS_MAX),
    "GGPO_HUNG_AFTER_SECONDS": (0, 30 * DAY_SECONDS),
    "GGPO_FAULT_PAUSE": (0, 3600),  # seconds, of each POINT=SECONDS
}


def _number(name: str, raw: str, kind: type, *, above_low: bool = False) -> float:
    """`raw` as a `kind` (int or float) within NUMBER_BOUNDS[name], else ConfigError naming it."""
    lo, hi = NUMBER_BOUNDS[name]
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    what = "an integer" if kind is int else "a number"
    rule = f"{what} {'above' if above_low else 'from'} {lo:,g} {'and at most' if above_low else 'to'} {hi:,.0f}"
    try:
        value = kind(raw.strip())  # int() of over 4,300 digits raises ValueError too
    except (ValueError, OverflowError):
        raise ConfigError(f"{name}={shown!r}: must be {rule}") from None
    if not (lo < value <= hi if above_low else lo <= value <= hi):  # NaN fails both
        raise ConfigError(f"{name}={shown!r}: must be {rule}")
    return value


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    return int(_number(name, raw, int))


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    return _number(name, raw, float)


# Settings fields computed from other settings rather than read under a name of their own (every
# other field is the setting GGPO_<FIELD>, which a settings file may hold: tests/test_settings_file.py).
DERIVED_FIELDS = frozenset({"user_declared"})


@dataclass(frozen=True)
class Settings:
    """Everything configurable from outside, read once at the edge and passed explicitly."""

    db_url: str
    redis_url: str
    data_dir: Path
    # GGPO_USER, or the login name: who this process says it is. Who it is on a ledger is decided by
    # ggpo_batch/config/identity.py (the PostgreSQL role, the OS user): GGPO_USER (`user_declared`) may
    # name someone else only where that identity may act for others.
    user: str
    queue: str = "ggpo"
    user_declared: bool = False  # derived: GGPO_USER was set (DERIVED_FIELDS)
    # Most GPUs a queue may have in flight (submitted or running) at once; 0 = no limit.
    queue_gpu_quota: int = 0
    # Seconds a run deferred by the quota waits before it is tried again.
    defer_seconds: int = 30
    # Cost caps (GPU-hours); None = no cap at that level.
    user_gpu_hours_cap: float | None = None
    queue_gpu_hours_cap: float | None = None
    # Most GPUs one person's runs (their experiments') may have in flight at once; 0 = no limit.
    # `role_gpu_quota` ((PostgreSQL role, GPUs), ...) overrides it for whoever is a member of such a
    # role (the largest of theirs applies): e.g. ggpo_lead=16, ggpo_member=8.
    user_gpu_quota: int = 0
    role_gpu_quota: tuple[tuple[str, int], ...] = ()
    # Fault injection for the fault suite: seconds a worker sleeps at a named point of a submission
    # (GGPO_FAULT_PAUSE="after_submit=30"), so a test can SIGKILL it exactly there.
    fault_pause: tuple[tuple[str, float], ...] = ()
    # A running attempt whose heartbeat (ggpo_batch/contracts/heartbeat.py) is older than this is flagged hung.
    hung_after_seconds: float = HUNG_AFTER_SECONDS
    # MLflow tracking store (ggpo_batch/train/run/tracking.py), e.g. sqlite:///path/mlflow.db; None: no tracking.
    mlflow_uri: str | None = None
    # Where notifications go (GGPO_NOTIFY_*, ggpo_batch/config/notify_targets.py); no sink: recorded, not sent.
    notify: NotifyTargets = field(default_factory=NotifyTargets)
    # How every process logs (ggpo_batch/config/logs.py): "text", or "json" (one JSON object a line).
    log_format: str = "text"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def inline_queue(self) -> bool:
        """`memory://`: jobs run inline in the caller, no worker and no reconciler."""
        return self.redis_url == MEMORY_REDIS

    def queue_for(self, experiment_queue: str | None) -> str:
        """The queue of an experiment: its own, or this installation's default."""
        return experiment_queue or self.queue


def environment(env: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """What the settings are read from: `env` as given, else os.environ over the settings files."""
    if env is not None:
        return env
    from .files import layered_environment

    return layered_environment(os.environ, setting_names)


def setting_names() -> frozenset[str]:
    """Every GGPO_ name a setting reads (what a settings file may set): those this module's readers
    ask an empty environment for, so a setting added here is known to the files at once."""
    from .files import names_asked

    return names_asked((load_settings, dashboard_token))


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: os.environ over the settings files); a bad value read from a
    settings file is named by that file and key."""
    from .files import attributed

    env = environment(env)
    with attributed(env):
        return _settings_from(env)


def _settings_from(env: Mapping[str, str]) -> Settings:
    data_dir = _data_dir(env)
    db_url = _secret(env, "GGPO_DB_URL") or f"sqlite:///{data_dir / 'ledger.sqlite3'}"
    redis_url = _secret(env, "GGPO_REDIS_URL") or "redis://127.0.0.1:6379/0"
    user = env.get("GGPO_USER") or os_user()
    problem = limits.user_problem(user)
    if problem:
        raise ConfigError(f"GGPO_USER {problem}" if env.get("GGPO_USER") else
                          f"the login name {problem}; set GGPO_USER")
    queue = env.get("GGPO_QUEUE") or "ggpo"
    problem = limits.name_problem(queue)
    if problem:
        raise ConfigError(f"GGPO_QUEUE {problem}")
    return Settings(
        db_url=db_url,
        redis_url=redis_url,
        data_dir=data_dir,
        user=user,
        user_declared=bool(env.get("GGPO_USER")),
        queue=queue,
        queue_gpu_quota=_int(env, "GGPO_QUEUE_GPU_QUOTA", 0),
        defer_seconds=_int(env, "GGPO_DEFER_SECONDS", 30),
        user_gpu_hours_cap=_float(env, "GGPO_USER_GPU_HOURS_CAP"),
        queue_gpu_hours_cap=_float(env, "GGPO_QUEUE_GPU_HOURS_CAP"),
        user_gpu_quota=_int(env, "GGPO_USER_GPU_QUOTA", 0),
        role_gpu_quota=_role_quotas(env, "GGPO_ROLE_GPU_QUOTA"),
        fault_pause=_fault_pause(env.get("GGPO_FAULT_PAUSE", "")),
        hung_after_seconds=_hung_after(env),
        mlflow_uri=mlflow_uri(env),
        notify=_notify(env),
        log_format=log_format(env),
    )


def _notify(env: Mapping[str, str]) -> NotifyTargets:
    targets = notify_targets(env, private_file_text)
    if targets.smtp_password:
        remember_secret(targets.smtp_password)
    return targets


# The environment a training job reads too (the allocation inherits the worker's environment).
MLFLOW_URI_ENV = "GGPO_MLFLOW_URI"
HUNG_AFTER_ENV = "GGPO_HUNG_AFTER_SECONDS"

def mlflow_uri(env: Mapping[str, str] | None = None) -> str | None:
    """The MLflow tracking URI from `env` (default: `environment()`), or None: tracking off."""
    env = environment(env)
    uri = env.get(MLFLOW_URI_ENV, "").strip() or None
    if uri:
        remember_password(uri)  # a database store's password never reaches output
    return uri


# How every process logs (ggpo_batch/config/logs.py); the processes a worker starts inherit it.
LOG_FORMAT_ENV = "GGPO_LOG_FORMAT"
LOG_FORMATS = ("text", "json")


def log_format(env: Mapping[str, str] | None = None) -> str:
    """GGPO_LOG_FORMAT from `env` (default: `environment()`): "text" (unset) or "json"."""
    env = environment(env)
    raw = env.get(LOG_FORMAT_ENV, "").strip().lower() or "text"
    if raw not in LOG_FORMATS:
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise ConfigError(f"{LOG_FORMAT_ENV}={shown!r}: must be one of {', '.join(LOG_FORMATS)}")
    return raw


def _hung_after(env: Mapping[str, str]) -> float:
    raw = env.get(HUNG_AFTER_ENV)
    if raw is None or raw == "":
        return HUNG_AFTER_SECONDS
    return _number(HUNG_AFTER_ENV, raw, float, above_low=True)


# The token every request to a dashboard (ggpo-batch dashboard) must carry; required off 127.0.0.1.
DASHBOARD_TOKEN_ENV = "GGPO_DASHBOARD_TOKEN"
DASHBOARD_TOKEN_MIN_LENGTH = 16


def dashboard_token(env: Mapping[str, str] | None = None) -> str | None:
    """The dashboard's token from `env` (default: `environment()`), or None if unset; remembered like a
    password, so `redact` hides it wherever it would appear."""
    import re

    env = environment(env)
    token = env.get(DASHBOARD_TOKEN_ENV, "").strip()
    if not token:
        return None
    if len(token) < DASHBOARD_TOKEN_MIN_LENGTH or not re.fullmatch(r"[A-Za-z0-9._~+/=-]+", token):
        raise ConfigError(f"{DASHBOARD_TOKEN_ENV}: must be at least {DASHBOARD_TOKEN_MIN_LENGTH} characters of "
                          f"letters, digits and ._~+/=- (e.g. `openssl rand -hex 24`)")
    remember(token)
    return token


FAULT_POINTS = ("before_submit", "after_submit", "after_cost_check")


def fault_pause(settings: Settings, point: str) -> None:
    """Sleep at a named point when GGPO_FAULT_PAUSE asks for it (fault tests only)."""
    import time

    for name, seconds in settings.fault_pause:
        if name == point:
            logging.getLogger(__name__).warning("fault injection: pausing %.1f s at %s", seconds, point)
            time.sleep(seconds)


def _fault_pause(raw: str) -> tuple[tuple[str, float], ...]:
    out = []
    for item in filter(None, (x.strip() for x in raw.split(","))):
        point, _, secs = item.partition("=")
        if point not in FAULT_POINTS:
            raise ConfigError(f"GGPO_FAULT_PAUSE: unknown point {point!r} (points: {', '.join(FAULT_POINTS)})")
        if not secs.strip():
            raise ConfigError(f"GGPO_FAULT_PAUSE: {item!r} must be POINT=SECONDS")
        out.append((point, _number("GGPO_FAULT_PAUSE", secs, float)))
    return tuple(out)


def os_user() -> str:
    """The OS user of this process, from its effective uid (not $USER or $LOGNAME, which anyone sets)."""
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a container's arbitrary uid): still something honest
        return f"uid{uid}"


def _role_quotas(env: Mapping[str, str], name: str) -> tuple[tuple[str, int], ...]:
    """`ROLE=GPUS,ROLE=GPUS` (PostgreSQL role names) as pairs; each GPU count an integer >= 0."""
    import re

    out = []
    for item in filter(None, (x.strip() for x in env.get(name, "").split(","))):
        role, _, gpus = item.partition("=")
        role = role.strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$-]{0,62}", role):
            raise ConfigError(f"{name}: {item!r} must be ROLE=GPUS, ROLE a PostgreSQL role name")
        out.append((role, _int({name: gpus.strip()}, name, 0) if gpus.strip() else -1))
        if out[-1][1] < 0:
            raise ConfigError(f"{name}: {item!r} must be ROLE=GPUS, GPUS an integer >= 0")
    return tuple(out)


# The settings whose values are secrets: remembered before a command prints anything (`remember_secrets`).
SECRET_URL_ENVS = ("GGPO_DB_URL", "GGPO_REDIS_URL", MLFLOW_URI_ENV)


def remember_secrets(env: Mapping[str, str] | None = None) -> None:
    """Remember the secrets of `env` (default: os.environ) for `redact` without checking them (a bad
    value is refused, with one line, where it is used): the passwords of the service URLs and the
    dashboard's token, so that output masks them even where a command never reads them itself."""
    env = os.environ if env is None else env
    for name in SECRET_URL_ENVS:
        if env.get(name):
            remember_password(env[name].strip())
    if env.get(DASHBOARD_TOKEN_ENV, "").strip():
        remember(env[DASHBOARD_TOKEN_ENV].strip())
