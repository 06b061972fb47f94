"""The package's own files (ggpo_batch/common/datafiles.py): where they are, what setup.cfg ships, the
profile and suite search path, and that nothing but provenance knows about the checkout."""

from __future__ import annotations

import configparser
import fnmatch
import subprocess
from pathlib import Path

import pytest

from ggpo_batch.common import datafiles
from ggpo_batch.contracts import code_provenance as provenance
from ggpo_batch.errors import SpecError
from ggpo_batch.executor.profile import load_profile
from ggpo_batch.nightly.suite import load_suite
from tests.support.paths import JOBS, PACKAGED, REPO


@pytest.fixture
def config_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(the user's config dir, the site's), both empty, in tmp_path."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(datafiles, "SITE_CONFIG_DIR", tmp_path / "etc" / "ggpo-batch")
    return tmp_path / "xdg" / "ggpo-batch", tmp_path / "etc" / "ggpo-batch"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_user_then_site_then_packaged_first_found_wins(config_dirs: tuple[Path, Path]) -> None:
    user, site = config_dirs
    assert datafiles.search_path("profiles") == (user / "profiles", site / "profiles", PACKAGED / "profiles")
    assert load_profile("default").partition == "gpu"  # the packaged one
    _write(site / "profiles" / "default.toml", 'schema = 1\npartition = "site"\n')
    assert load_profile("default").partition == "site"
    _write(user / "profiles" / "default.toml", 'schema = 1\npartition = "mine"\n')
    assert load_profile("default").partition == "mine"
    assert load_profile("dev-cluster").partition == "dev"  # names the user and site lack still come packaged
    suite_text = (PACKAGED / "suites" / "nightly-cpu.toml").read_text().replace('name = "nightly-cpu"', 'name = "ours"')
    _write(site / "suites" / "nightly-cpu.toml", suite_text)
    assert load_suite().name == "ours"
    assert load_suite(PACKAGED / "suites" / "nightly-cpu.toml").name == "nightly-cpu"  # a path is a path


def test_a_missing_name_names_every_folder_looked_in(config_dirs: tuple[Path, Path]) -> None:
    user, site = config_dirs
    _write(user / "profiles" / "mine.toml", "schema = 1\n")
    with pytest.raises(SpecError) as err:
        load_profile("nope")
    for folder in (user / "profiles", site / "profiles", PACKAGED / "profiles"):
        assert str(folder) in err.value.message
    assert "known: default, dev-cluster" in err.value.message and "mine" in err.value.message
    with pytest.raises(SpecError, match="no such nightly suite in .*suites"):
        load_suite("nope")
    with pytest.raises(SpecError, match="not a nightly suite name"):
        load_suite("a b")


def test_the_packaged_examples_are_the_checkouts_jobs() -> None:
    """jobs/ is where a checkout's user finds the examples (docs/researcher.md's commands); the wheel ships
    copies. A change to one copy alone fails here: change both."""
    packaged = sorted(p.name for p in (PACKAGED / "examples").glob("*.toml"))
    assert packaged == ["demo-cpu.toml", "exposure-5arm.toml"]
    for name in packaged:
        assert (PACKAGED / "examples" / name).read_bytes() == (JOBS / name).read_bytes(), name


def test_setup_cfg_ships_every_data_file() -> None:
    """Every file under ggpo_batch/ that is not a module is matched by setup.cfg's package_data
    (a new folder of data, or a migration in a new place, would otherwise be missing from the wheel)."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    patterns: list[str] = []
    for package, value in cfg.items("options.package_data"):
        base = package.replace(".", "/")
        patterns += [f"{base}/{p.strip()}" for line in value.splitlines() for p in line.split(",") if p.strip()]
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard",
                             "ggpo_batch"], capture_output=True, text=True, check=True).stdout.split()
    data = [f for f in listed if not f.endswith(".py") or "/migrations/" in f]
    unshipped = [f for f in data if (REPO / f).is_file() and not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert unshipped == []


def test_only_provenance_reads_the_checkout() -> None:
    """`grep -rn REPO_DIR ggpo_batch` shows provenance alone: the package reads its files from
    itself (datafiles.py), whether it runs from a checkout or from a wheel."""
    users = sorted(str(p.relative_to(REPO)) for p in (REPO / "ggpo_batch").rglob("*.py") if "REPO_DIR" in p.read_text())
    assert users == ["ggpo_batch/contracts/code_provenance.py"]


def test_provenance_knows_a_checkout_from_an_enclosing_repository(tmp_path: Path) -> None:
    """A package installed in a venv inside some git repository is not a checkout: no commit of
    that repository may be recorded as the code's."""
    assert provenance.REPO_DIR == REPO  # the tests run from the checkout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    assert provenance._checkout(site) is None
    assert provenance._checkout(tmp_path) is None  # a repository, but not ggpo-batch's
    (tmp_path / "setup.cfg").write_text((REPO / "setup.cfg").read_text())
    assert provenance._checkout(tmp_path) == tmp_path
    assert provenance.git_commit(None) is None and provenance.uncommitted(["ggpo_batch/x.py"], None) is None
