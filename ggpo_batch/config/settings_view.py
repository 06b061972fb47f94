"""The effective settings and where each came from, as `ggpo-batch config` shows them.

Every field of `config.Settings` is the setting GGPO_<FIELD> (a nested dataclass adds its name:
`notify.smtp_host` is GGPO_NOTIFY_SMTP_HOST), so the list follows Settings without a line per
setting. Each is shown as the code will use it (parsed, defaults filled in) with its source: the
environment (which variable: the setting or its `_FILE`), a settings file (which file and key), or
the default. Passwords, tokens and webhook URLs are masked; a secret file is shown by its path.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .files import PREFIX, LayeredEnvironment, environment_source, is_secret
from .secrets import redact
from .settings import environment, load_settings, setting_names

MASK = "***"


def effective_settings(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """{"files": [...], "settings": [...]}: the settings files looked at, and every setting with its
    value and source. Refused (ConfigError) as `load_settings` refuses."""
    layered = environment(None) if env is os.environ else _layered(env)
    settings = load_settings(layered)
    files = getattr(layered, "files", [])
    rows = [_row(name, key, value, layered, env) for name, key, value in _fields(settings, ())]
    shown = {r["name"] for r in rows}
    for name in sorted(setting_names() - shown):
        if name.endswith("_FILE") and name.removesuffix("_FILE") in shown:
            continue  # shown as its setting's source
        raw = layered.get(name)
        rows.append(_row(name, name.removeprefix(PREFIX).lower(), raw, layered, env))
    return {"files": [{"path": str(f.path), "role": f.role, "found": f.found} for f in files], "settings": rows}


def _layered(env: Mapping[str, str]) -> Mapping[str, str]:
    from .files import layered_environment

    return layered_environment(env, setting_names)


def _fields(obj: Any, where: tuple[str, ...]) -> Iterator[tuple[str, str, Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = (*where, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _fields(value, path)
        else:
            yield PREFIX + "_".join(path).upper(), ".".join(path), value


def _row(name: str, key: str, value: Any, layered: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Any]:
    by_env = environment_source(name, env)
    source = None
    if isinstance(layered, LayeredEnvironment):
        source = layered.source(name) or layered.source(f"{name}_FILE")
    if by_env is not None:
        where: dict[str, Any] = {"source": "env", "set_by": by_env, "file": None}
    elif source is not None:
        where = {"source": "file", "set_by": source[1], "file": str(source[0])}
    else:
        where = {"source": "default", "set_by": None, "file": None}
    return {"name": name, "key": key, "value": shown(name, value), **where}


def shown(name: str, value: Any) -> Any:
    """A value as printed: secrets masked, URLs' passwords hidden, paths and tuples as text and lists."""
    if value is None or value == "" or value == ():
        return None if value is None or value == "" else []
    if is_secret(name):
        return MASK
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [shown(name, v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value
