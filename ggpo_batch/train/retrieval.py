"""BM25 search over the task corpus (bm25s), the environment's one tool."""

from __future__ import annotations

import logging

import bm25s

from .task import Passage

log = logging.getLogger(__name__)


class Retriever:
    """A BM25 index over passages (title + text); built once per rank, in memory."""

    def __init__(self, corpus: tuple[Passage, ...]) -> None:
        self.corpus = corpus
        self._bm25 = bm25s.BM25()
        tokens = bm25s.tokenize([f"{p.title} {p.text}" for p in corpus], stopwords="en", show_progress=False)
        self._bm25.index(tokens, show_progress=False)

    def search(self, query: str, k: int) -> list[Passage]:
        """Top-k passages for `query`; an empty list when the query has no indexable word."""
        q = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not q or not q[0]:
            return []
        k = min(k, len(self.corpus))
        docs, scores = self._bm25.retrieve([q[0]], k=k, show_progress=False)
        return [self.corpus[int(i)] for i, s in zip(docs[0], scores[0]) if s > 0]
