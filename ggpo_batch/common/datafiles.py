"""Where ggpo-batch finds its own files: the data shipped inside the package, and the search path
of Slurm profiles and nightly suites.

Everything the package reads at run time lives under the package, so a wheel installed anywhere
(a fresh venv, an image) has it: `ledger/migrations/` (Alembic), `data/profiles/`, `data/suites/`,
`data/examples/` (example specs, copies of the checkout's `jobs/`) and `data/starter/` (what
`ggpo-batch init` writes). A profile or suite named without a path is looked up in the user's
directory, then the site's, then the packaged defaults: the first file found wins, so a site can
replace `default.toml` and a user can replace the site's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from ..errors import SpecError

APP_NAME = "ggpo-batch"  # the name of its folders: user data and config (platformdirs), the site's /etc
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # ggpo_batch/ (this module is in ggpo_batch/common/)
MIGRATIONS_DIR = PACKAGE_DIR / "ledger" / "migrations"
PACKAGED_DIR = PACKAGE_DIR / "data"
EXAMPLES_DIR = PACKAGED_DIR / "examples"
STARTER_DIR = PACKAGED_DIR / "starter"
# The site's directory, the same on every Linux host (an admin's /etc, not XDG_CONFIG_DIRS).
SITE_CONFIG_DIR = Path("/etc") / APP_NAME

Kind = Literal["profiles", "suites"]
KINDS: tuple[Kind, ...] = ("profiles", "suites")
_WHAT = {"profiles": "Slurm profile", "suites": "nightly suite"}
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def user_config_dir() -> Path:
    """`~/.config/ggpo-batch` (XDG_CONFIG_HOME honoured, by platformdirs)."""
    from platformdirs import user_config_dir as platform_user_config_dir

    return Path(platform_user_config_dir(APP_NAME, appauthor=False))


def search_path(kind: Kind) -> tuple[Path, ...]:
    """The folders a `kind` file is looked up in, first match wins: user, site, packaged."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return (user_config_dir() / kind, SITE_CONFIG_DIR / kind, PACKAGED_DIR / kind)


def search_path_text(kind: Kind) -> str:
    """The search path as `--help` and errors print it."""
    return ", then ".join(str(d) for d in search_path(kind))


def is_path(name_or_path: str | Path) -> bool:
    """A file named by path (`x.toml`, `dir/x`, `~/x`, absolute) rather than by name."""
    text = str(name_or_path)
    return text.endswith(".toml") or "/" in text or text.startswith("~")


def known(kind: Kind, dirs: Sequence[Path] | None = None) -> list[str]:
    """Every name found on the search path (or in `dirs`), sorted."""
    dirs = search_path(kind) if dirs is None else dirs
    return sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.toml")})


def find(kind: Kind, name_or_path: str | Path, dirs: Sequence[Path] | None = None) -> Path:
    """The file of a profile or suite: a path as given, or `<name>.toml` from the first folder of the
    search path (or of `dirs`) that has it. A name found nowhere: SpecError naming every folder."""
    if is_path(name_or_path):
        return Path(name_or_path).expanduser()
    name = str(name_or_path)
    what = _WHAT[kind]
    if not _NAME.match(name):
        raise SpecError(name, "", f"not a {what} name ([A-Za-z0-9_-]+) nor a path to a .toml file")
    dirs = search_path(kind) if dirs is None else dirs
    for folder in dirs:
        candidate = folder / f"{name}.toml"
        if candidate.is_file():
            return candidate
    names = known(kind, dirs)
    raise SpecError(name, "", f"no such {what} in {', '.join(str(d) for d in dirs)} (known: {', '.join(names) or 'none'})")
