"""BM25 search over the task corpus (bm25s), the environment's one tool."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .qa import Passage

log = logging.getLogger(__name__)


class Retriever:
    """A BM25 index over passages (title + text); built once per rank, in memory."""

    def __init__(self, corpus: tuple[Passage, ...]) -> None:
        import bm25s  # here, not at import: the trainer's module imports on a machine without it (tools/gpu)

        self.corpus = corpus
        self._bm25 = bm25s.BM25()
        if not corpus:  # a single-turn task: no search tool, nothing to index
            return
        tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in corpus], stopwords="en", show_progress=False)
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[Passage]:
        """Top-k passages for `query`; an empty list when the query has no indexable word."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """`search` of each query, in one call to the index (what one engine step's search calls ask)."""
        if not queries:
            return []
        if not self.corpus:
            return [[] for _ in queries]
        import bm25s

        words = bm25s.tokenize(list(queries), stopwords="en", show_progress=False, return_ids=False)
        asked = [i for i, w in enumerate(words) if w]
        found: list[list[Passage]] = [[] for _ in queries]
        if asked:
            docs, scores = self._bm25.retrieve([words[i] for i in asked], k=min(k, len(self.corpus)),
                                               show_progress=False)
            for row, i in enumerate(asked):
                found[i] = [self.corpus[int(d)] for d, s in zip(docs[row], scores[row]) if s > 0]
        return found
