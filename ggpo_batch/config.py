"""Settings from the environment: the one module that reads env vars.

Secrets (database and Redis URLs with passwords) come from the environment or from a file with
0600 permissions (`GGPO_DB_URL_FILE`, `GGPO_REDIS_URL_FILE`); `redact()` keeps them out of output.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

# The checkout the package runs from (profiles, jobs, migrations live beside the package).
REPO_DIR = Path(__file__).resolve().parent.parent

APP_NAME = "ggpo-batch"
MEMORY_REDIS = "memory://"  # embedded quick start: fakeredis, jobs run inline in the caller


def _data_dir(env: Mapping[str, str]) -> Path:
    if env.get("GGPO_DATA_DIR"):
        return Path(env["GGPO_DATA_DIR"]).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME, appauthor=False))


def _secret(env: Mapping[str, str], name: str) -> str | None:
    """`NAME` from env, else the contents of the file named by `NAME_FILE`, which must be 0600."""
    if env.get(name):
        return env[name].strip()
    path = env.get(f"{name}_FILE")
    if not path:
        return None
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise ConfigError(f"{name}_FILE={path}: cannot read ({exc.strerror})") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"{name}_FILE={path}: permissions {stat.S_IMODE(st.st_mode):04o}; must be 0600 (chmod 600)")
    return p.read_text().strip()


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: must be an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r}: must be >= 0")
    return value


def _float(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: must be a number") from None
    if not value >= 0:
        raise ConfigError(f"{name}={raw!r}: must be >= 0")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything configurable from outside, read once at the edge and passed explicitly."""

    db_url: str
    redis_url: str
    data_dir: Path
    user: str
    queue: str = "ggpo"
    # Most GPUs a queue may have in flight (submitted or running) at once; 0 = no limit.
    queue_gpu_quota: int = 0
    # Seconds a run deferred by the quota waits before it is tried again.
    defer_seconds: int = 30
    # Cost caps (GPU-hours); None = no cap at that level.
    user_gpu_hours_cap: float | None = None
    queue_gpu_hours_cap: float | None = None
    # Fault injection for the fault suite: seconds a worker sleeps at a named point of a submission
    # (GGPO_FAULT_PAUSE="after_submit=30"), so a test can SIGKILL it exactly there.
    fault_pause: tuple[tuple[str, float], ...] = ()

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


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from `env` (default: os.environ)."""
    env = os.environ if env is None else env
    data_dir = _data_dir(env)
    db_url = _secret(env, "GGPO_DB_URL") or f"sqlite:///{data_dir / 'ledger.sqlite3'}"
    redis_url = _secret(env, "GGPO_REDIS_URL") or "redis://127.0.0.1:6379/0"
    user = env.get("GGPO_USER") or _login()
    return Settings(
        db_url=db_url,
        redis_url=redis_url,
        data_dir=data_dir,
        user=user,
        queue=env.get("GGPO_QUEUE") or "ggpo",
        queue_gpu_quota=_int(env, "GGPO_QUEUE_GPU_QUOTA", 0),
        defer_seconds=_int(env, "GGPO_DEFER_SECONDS", 30),
        user_gpu_hours_cap=_float(env, "GGPO_USER_GPU_HOURS_CAP"),
        queue_gpu_hours_cap=_float(env, "GGPO_QUEUE_GPU_HOURS_CAP"),
        fault_pause=_fault_pause(env.get("GGPO_FAULT_PAUSE", "")),
    )


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
        try:
            out.append((point, float(secs)))
        except ValueError:
            raise ConfigError(f"GGPO_FAULT_PAUSE: {item!r} must be POINT=SECONDS") from None
    return tuple(out)


def _login() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): still record something honest
        return f"uid{os.getuid()}"


_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@\s]*)@", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the password of every URL in it replaced by ***."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
