"""The text corpus of the nightly tier: a file checked by size before it is read and by sha256
after, or a deterministic generated fallback; split by byte ranges into train/validation/test.

The split object also records every byte range served for training, so the run can prove that
held-out bytes never reached an optimizer (an execution check computed, not asserted).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GgpoError

if TYPE_CHECKING:  # torch is imported where a tensor is made: the suite (and the dashboard) load without it
    import torch

log = logging.getLogger(__name__)

GENERATED_ID = "generated:ggpo-batch-words-v1"
SPLIT_NAMES = ("train", "validation", "test")


class CorpusError(GgpoError):
    """A corpus that cannot be used: missing, too large, wrong sha256, too small to split."""


@dataclass(frozen=True)
class CorpusSource:
    """What the suite expects of the corpus: id, where it lives, its sha256, and the size cap."""

    id: str
    path: Path | None
    sha256: str | None
    source_url: str | None
    max_bytes: int
    generated_bytes: int = 160_000


@dataclass(frozen=True)
class Corpus:
    """Loaded corpus bytes with the identity the record names."""

    id: str
    data: bytes
    sha256: str
    source_url: str | None
    path: Path | None  # None for the generated corpus

    @property
    def generated(self) -> bool:
        return self.path is None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_file(path: Path, *, corpus_id: str, expected_sha256: str | None, max_bytes: int,
              source_url: str | None = None) -> Corpus:
    """Read a corpus file: refused on its size (stat, before any open), then on its sha256."""
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise CorpusError(f"{path}: corpus file not found (run tools/fetch_corpus.py --dest DIR)") from None
    if size > max_bytes:
        raise CorpusError(f"{path}: corpus is {size} bytes, over the cap of {max_bytes} bytes; not read")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise CorpusError(
            f"{path}: sha256 is {digest}, expected {expected_sha256.lower()} (--corpus-sha256); refusing this corpus"
        )
    return Corpus(id=corpus_id, data=data, sha256=digest, source_url=source_url, path=path)


_WORDS = ["the", "of", "and", "to", "in", "that", "is", "was", "he", "for", "it", "with", "as", "his", "on", "be", "at", "by", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world"]


def generate_corpus(n_bytes: int, seed: int = 0) -> bytes:
    """Deterministic English-like ASCII text (word list, sentences, line breaks) of exactly n_bytes."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        line = " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ","]) + "\n"
        parts.append(line)
        size += len(line)
    return "".join(parts).encode("ascii")[:n_bytes]


def load_corpus(source: CorpusSource, *, path: Path | None = None, expected_sha256: str | None = None) -> Corpus:
    """The corpus a run uses.

    An explicit `path` is read (and checked against `expected_sha256` when given); it keeps the
    suite's id only if its sha256 is the suite's, else it is named `file:<name>`. Without a path,
    the suite's file is used if present (its pinned sha256 enforced), else the generated fallback.
    """
    if path is not None:
        data_id = f"file:{path.name}"
        corpus = load_file(path, corpus_id=data_id, expected_sha256=expected_sha256, max_bytes=source.max_bytes)
        if source.sha256 is not None and corpus.sha256 == source.sha256:
            corpus = Corpus(id=source.id, data=corpus.data, sha256=corpus.sha256,
                            source_url=source.source_url, path=path)
        return corpus
    if source.path is not None and source.path.exists():
        return load_file(source.path, corpus_id=source.id, expected_sha256=expected_sha256 or source.sha256,
                         max_bytes=source.max_bytes, source_url=source.source_url)
    log.warning("corpus %s not found at %s; using the generated fallback corpus", source.id, source.path)
    data = generate_corpus(source.generated_bytes)
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise CorpusError(f"{GENERATED_ID}: sha256 is {digest}, expected {expected_sha256.lower()}")
    return Corpus(id=f"{GENERATED_ID}/bytes={len(data)}", data=data, sha256=digest, source_url=None, path=None)


def byte_ranges(n: int, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> dict[str, tuple[int, int]]:
    """Contiguous [start, end) ranges: train first, then validation, then test (seed 003's layout)."""
    if abs(sum(fractions) - 1.0) > 1e-9 or min(fractions) <= 0:
        raise CorpusError(f"split fractions {fractions} must be positive and sum to 1")
    a = int(n * fractions[0])
    b = int(n * (fractions[0] + fractions[1]))
    return {"train": (0, a), "validation": (a, b), "test": (b, n)}


@dataclass
class ByteSplit:
    """The corpus as three byte ranges; training windows come only from `train_window`, which logs them."""

    data: torch.Tensor  # uint8 -> int64 ids, whole corpus
    ranges: dict[str, tuple[int, int]]
    served: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, corpus: Corpus, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
           min_range: int = 64) -> ByteSplit:
        ranges = byte_ranges(len(corpus.data), fractions)
        for name, (lo, hi) in ranges.items():
            if hi - lo < min_range:
                raise CorpusError(f"{corpus.id}: {name} range has {hi - lo} bytes, fewer than {min_range}")
        import torch

        ids = torch.frombuffer(bytearray(corpus.data), dtype=torch.uint8).to(torch.int64)
        return cls(data=ids, ranges=ranges)

    def train_windows(self, gen: torch.Generator, batch: int, length: int) -> torch.Tensor:
        """`batch` random windows of `length` bytes from the train range: [batch, length]."""
        import torch

        lo, hi = self.ranges["train"]
        starts = torch.randint(lo, hi - length + 1, (batch,), generator=gen)
        for s in starts.tolist():
            self.served.append((s, s + length))
        return torch.stack([self.data[s:s + length] for s in starts.tolist()])

    def heldout_chunks(self, name: str, length: int) -> torch.Tensor:
        """The whole validation or test range as consecutive chunks [n, length] (tail dropped)."""
        if name == "train":
            raise ValueError("heldout_chunks serves validation/test only")
        lo, hi = self.ranges[name]
        n = (hi - lo) // length
        return self.data[lo:lo + n * length].view(n, length)

    def heldout_bytes_touched_by_training(self, since: int = 0) -> int:
        """How many bytes of the windows served for training (from index `since`) lie outside the train range."""
        lo, hi = self.ranges["train"]
        return sum((e - s) - max(0, min(e, hi) - max(s, lo)) for s, e in self.served[since:])
