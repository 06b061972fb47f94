"""`python -m ggpo_batch.smoke`: a quick check of an install, and the image's HEALTHCHECK.

It checks what a wheel installed outside the checkout needs and a checkout hides: the package's own
files are where it reads them (ggpo_batch/common/datafiles.py) and they work. Each check can fail:
  ledger    the packaged migrations upgrade a new SQLite ledger to the revision this code expects
  profiles  every profile on the search path loads (user, site, packaged)
  suite     the default nightly suite loads
  examples  every packaged example spec loads
  init      `ggpo-batch init` writes its starter, and that spec passes preflight as written
Nothing outside a temporary folder is written. One line per check; exit 0 when all passed, 1 if not.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def _ledger(tmp: Path) -> str:
    from .ledger.db import current_revision, head_revision, make_engine, upgrade

    engine = make_engine(f"sqlite:///{tmp / 'smoke.sqlite3'}")
    try:
        upgrade(engine)
        got, want = current_revision(engine), head_revision()
    finally:
        engine.dispose()
    if got != want:
        raise RuntimeError(f"upgraded to {got!r}, but this code expects {want!r}")
    from .common.datafiles import MIGRATIONS_DIR

    return f"{MIGRATIONS_DIR} -> {got}"


def _profiles(tmp: Path) -> str:
    from .common.datafiles import known
    from .executor.profile import load_profile

    names = known("profiles")
    if "default" not in names:
        raise RuntimeError(f"no default profile (found: {', '.join(names) or 'none'})")
    for name in names:
        load_profile(name)
    return ", ".join(names)


def _suite(tmp: Path) -> str:
    from .nightly.suite import load_suite

    suite = load_suite()
    return f"{suite.name} ({suite.path})"


def _examples(tmp: Path) -> str:
    from .common.datafiles import EXAMPLES_DIR
    from .spec.parse import load_spec

    paths = sorted(EXAMPLES_DIR.glob("*.toml"))
    if not paths:
        raise RuntimeError(f"no example spec in {EXAMPLES_DIR}")
    specs = [load_spec(p) for p in paths]
    return ", ".join(f"{s.name} ({len(s.arms)} arms x {len(s.seeds)} seeds)" for s in specs)


def _init(tmp: Path) -> str:
    from .spec import preflight
    from .spec.parse import load_spec
    from .spec.starter import write_starter

    written = write_starter(tmp / "init")
    report = preflight.check(load_spec(written.spec))
    if report.problems:
        raise RuntimeError("; ".join(f"{p.field}: {p.message}" for p in report.problems))
    return f"{written.spec.name} passes preflight"


CHECKS: tuple[tuple[str, Callable[[Path], str]], ...] = (
    ("ledger", _ledger), ("profiles", _profiles), ("suite", _suite), ("examples", _examples), ("init", _init))


def main(argv: list[str] | None = None) -> int:
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ggpo-smoke-") as folder:
        for name, check in CHECKS:
            try:
                print(f"ok    {name}: {check(Path(folder))}")
            except Exception as exc:  # noqa: BLE001  (every failure is reported, then the next check runs)
                failed += 1
                print(f"FAIL  {name}: {type(exc).__name__}: {exc}")
    print(f"smoke: {len(CHECKS) - failed} of {len(CHECKS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
