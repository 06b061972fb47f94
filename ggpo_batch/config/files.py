"""The settings files: the same settings as the `GGPO_*` environment variables, in TOML.

Read, lowest first: the site's `/etc/ggpo-batch/config.toml`, then the user's
`~/.config/ggpo-batch/config.toml` (XDG_CONFIG_HOME honoured), then the environment: each layer
overrides the ones below it. `GGPO_CONFIG=FILE` reads that one file instead of the site's and the
user's. A key names its variable: `queue_gpu_quota = 4` is GGPO_QUEUE_GPU_QUOTA, and a table adds
its name, so `[notify] smtp_host = "mail"` is GGPO_NOTIFY_SMTP_HOST. Nothing here knows a setting:
the files become one mapping (`layered_environment`) that `config.load_settings` reads as it reads
os.environ, so every setting, present or future, works from a file. A key no reader asks for is
refused, naming the file and the key. A settings file that others than its owner (and root) may
write (group- or world-writable) is refused, naming the file and `chmod go-w` (as ssh does for its keys).

Secrets are never in a settings file (it is meant to be readable, or copied around): a key that
holds one (a password, a token, webhook URLs, a URL with a password) is refused with the `_file`
key to use instead, a 0600 file holding the secret. Paths in `*_file` and `*_dir` keys are relative
to the settings file's folder.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import date, time
from pathlib import Path
from typing import Any

from ..errors import ConfigError, GgpoError

PREFIX = "GGPO_"
CONFIG_ENV = "GGPO_CONFIG"  # one settings file read instead of the site's and the user's
FILE_NAME = "config.toml"
SETTINGS_FILE_MAX_BYTES = 256 << 10
# Names that hold a secret: refused in a settings file (their `_FILE` twin names a 0600 file).
SECRET_SUFFIXES = ("_PASSWORD", "_TOKEN", "_SECRET", "_WEBHOOK_URLS")
_NAME = re.compile(r"GGPO_[A-Z0-9_]+")


@dataclass(frozen=True)
class SettingsFile:
    """One settings file on the search path, and whether it was there to read."""

    path: Path
    role: str  # site | user | GGPO_CONFIG
    found: bool


def search_files(env: Mapping[str, str], site_dir: Path | None = None) -> list[SettingsFile]:
    """The settings files `env` reads, lowest layer first: GGPO_CONFIG's alone, else the site's and the user's."""
    from ..common.datafiles import SITE_CONFIG_DIR, user_config_dir

    named = env.get(CONFIG_ENV, "").strip()
    if named:
        path = Path(named).expanduser()
        return [SettingsFile(path, CONFIG_ENV, path.exists())]
    files = [(Path(site_dir or SITE_CONFIG_DIR) / FILE_NAME, "site"), (user_config_dir() / FILE_NAME, "user")]
    return [SettingsFile(p, role, _present(p)) for p, role in files]


def _present(path: Path) -> bool:
    """Whether a default settings file is there for this user. One in a folder the user may not enter
    (a HOME inherited from another user, root's 0700 one) is not theirs to read: absent."""
    try:
        return path.is_file()
    except PermissionError:
        return False


class LayeredEnvironment(Mapping[str, str]):
    """The environment over the settings files: every name's value and where it came from."""

    def __init__(self, values: Mapping[str, str], sources: Mapping[str, tuple[Path, str] | None],
                 files: list[SettingsFile]) -> None:
        self._values = dict(values)
        self._sources = dict(sources)  # name -> (file, key), or None: the environment
        self.files = files

    def __getitem__(self, name: str) -> str:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def source(self, name: str) -> tuple[Path, str] | None:
        """(file, key) a name's value was read from; None when from the environment or unset."""
        return self._sources.get(name)


def layered_environment(env: Mapping[str, str], known_names: Callable[[], frozenset[str]], *,
                        site_dir: Path | None = None) -> LayeredEnvironment:
    """`env` over the settings files it names (see the module's docstring), each key checked against
    `known_names()` (`config.setting_names`); bad files: ConfigError."""
    files = search_files(env, site_dir)
    named = files[0] if files and files[0].role == CONFIG_ENV else None
    if named is not None and not named.found:
        raise ConfigError(f"{CONFIG_ENV}={env[CONFIG_ENV]}: no such file")
    values: dict[str, str] = {}
    sources: dict[str, tuple[Path, str] | None] = {}
    found = [f for f in files if f.found]
    known = known_names() if found else frozenset()
    for f in found:
        layer = read_file(f.path, known)
        _overlay(values, sources, {n: (v, (f.path, k)) for n, (k, v) in layer.items()})
    given = {n: v for n, v in env.items() if v != ""}  # an empty variable is unset: the file's value stands
    _overlay(values, sources, {n: (v, None) for n, v in given.items()})
    return LayeredEnvironment(values, sources, files)


def _overlay(values: dict[str, str], sources: dict[str, tuple[Path, str] | None],
             layer: Mapping[str, tuple[str, tuple[Path, str] | None]]) -> None:
    """Put `layer` over `values`. A secret and its `_FILE` twin are one setting: a layer that sets
    either replaces both below it (the environment's GGPO_DB_URL_FILE beats a file's db_url)."""
    for name in layer:
        base = name.removesuffix("_FILE")
        for twin in (base, f"{base}_FILE"):
            if twin not in layer:
                values.pop(twin, None)
                sources.pop(twin, None)
    for name, (value, source) in layer.items():
        values[name], sources[name] = value, source


def read_file(path: Path, known: frozenset[str]) -> dict[str, tuple[str, str]]:
    """A settings file as {GGPO_NAME: (dotted key, value as text)}; refused (ConfigError naming the file
    and the key) if it is not TOML, or has a key that is not in `known` or holds a secret, or a
    value that is not a setting's."""
    from ..common import limits

    _refuse_writable_by_others(path)
    try:
        raw = limits.read_input_file(path, max_bytes=SETTINGS_FILE_MAX_BYTES, what="settings file")
        data = tomllib.loads(raw.decode("utf-8"))
    except limits.InputRefused as exc:
        raise ConfigError(f"{path}: {exc.problem}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    out: dict[str, tuple[str, str]] = {}
    for key, value in _flatten(path, data, ()):
        name = PREFIX + key.replace(".", "_").upper()
        if name not in known:
            raise ConfigError(f"{path}: unknown key {key!r} (it would set {name}, which no setting reads; "
                              f"`ggpo-batch config` lists the keys)")
        text = _text(path, key, value)
        _refuse_secret(path, key, name, text, known)
        out[name] = (key, _resolve(path, name, text))
    return out


def _refuse_writable_by_others(path: Path) -> None:
    """A settings file decides where the ledger, the queue and the notifications go: one that others
    than its owner and root may write is refused, as ssh refuses such a key (ConfigError with the fix)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return  # reading it says what is wrong
    if mode & 0o022:
        raise ConfigError(f"{path}: writable by others than its owner (mode {mode:04o}); a settings file decides "
                          f"where the ledger, the queue and the notifications go: chmod go-w {path}")


def _flatten(path: Path, table: Mapping[str, Any], where: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    for key, value in table.items():
        dotted = ".".join((*where, key))
        if not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            raise ConfigError(f"{path}: key {dotted!r}: keys are lower case letters, digits and '_'")
        if isinstance(value, dict):
            yield from _flatten(path, value, (*where, key))
        else:
            yield dotted, value


def _text(path: Path, key: str, value: Any) -> str:
    """A TOML value as an environment variable would hold it: lists comma-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)) and not isinstance(value, (date, time)):
        return str(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value):
        items = [str(v) for v in value]
        if any("," in v for v in items):
            raise ConfigError(f"{path}: {key}: a list item may not contain ','")
        return ",".join(items)
    raise ConfigError(f"{path}: {key}: {type(value).__name__} is not a setting's value (a string, number, "
                      f"true/false or a list of strings)")


def _refuse_secret(path: Path, key: str, name: str, value: str, known: frozenset[str]) -> None:
    from ..common.limits import url_userinfo

    with_password = any(":" in (url_userinfo(v) or "") for v in value.split(",") if "://" in v)
    if not (is_secret(name) or with_password):
        return
    instead = (f"put it in a file only you can read (chmod 600) and name that file with {key}_file"
               if f"{name}_FILE" in known else f"set {name} in the environment instead")
    raise ConfigError(f"{path}: {key}: a secret is not kept in a settings file; {instead}")


def _resolve(path: Path, name: str, value: str) -> str:
    """A path in a `*_FILE` or `*_DIR` setting, relative to the settings file's folder."""
    if not name.endswith(("_FILE", "_DIR")) or not value:
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (path.parent / p))


@contextmanager
def attributed(env: Mapping[str, str]) -> Iterator[None]:
    """Re-raise a ConfigError about a setting read from a settings file as about that file and key:
    `GGPO_QUEUE_GPU_QUOTA='x': ...` becomes `/etc/ggpo-batch/config.toml: queue_gpu_quota='x': ...`."""
    try:
        yield
    except ConfigError as exc:
        if not isinstance(env, LayeredEnvironment):
            raise
        for name in sorted(set(_NAME.findall(exc.message)), key=len, reverse=True):
            source = env.source(name)
            if source is not None:
                path, key = source
                raise ConfigError(exc.message.replace(name, f"{path}: {key}", 1)) from None
        raise


class _Asked(Mapping[str, str]):
    """An empty environment that remembers every name asked of it."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.names.add(name)
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        self.names.add(name)
        return default

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.names.add(name)
        return False

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def names_asked(readers: Iterable[Callable[[Mapping[str, str]], Any]]) -> frozenset[str]:
    """Every GGPO_ name the `readers` (config's) ask an empty environment for."""
    asked = _Asked()
    for reader in readers:
        with suppress(GgpoError):
            reader(asked)
    return frozenset(n for n in asked.names if n.startswith(PREFIX) and n != CONFIG_ENV)


def is_secret(name: str) -> bool:
    """A setting whose value is shown masked."""
    return name.endswith(SECRET_SUFFIXES)


def environment_source(name: str, env: Mapping[str, str] = os.environ) -> str | None:
    """The variable of the environment that sets `name` (itself or its `_FILE` twin), or None."""
    for candidate in (name, f"{name}_FILE"):
        if env.get(candidate):
            return candidate
    return None
