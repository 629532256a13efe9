"""Product search: BM25 (the `bm25s` library) over each product's text.

The original runs Lucene through pyserini (Java); BM25 with English stop words is the same family of
ranking and needs nothing outside PyPI.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s

from agentgym_opsd.environments.webshop.models import Product

__all__ = ["ProductSearch", "MAX_QUERY_TOKENS"]

MAX_QUERY_TOKENS = 64
"""Longer queries are cut to their first 64 known tokens (a huge query would only cost time)."""


class ProductSearch:
    """Top-k product indices for a free-text query; results with a zero score are dropped."""

    def __init__(self, products: Sequence[Product]) -> None:
        if not products:
            raise ValueError("ProductSearch needs at least one product")
        self.num_products = len(products)
        corpus_tokens = bm25s.tokenize([p.search_text() for p in products], stopwords="en", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(corpus_tokens, show_progress=False)

    def search(self, query: str, k: int = 50) -> list[int]:
        """Indices into the product list, best first, at most `k` (fewer when few products match)."""
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)[0]
        vocab = self._bm25.vocab_dict
        known = [t for t in tokens if t in vocab][:MAX_QUERY_TOKENS]
        if not known or k < 1:
            return []
        docs, scores = self._bm25.retrieve([known], k=min(k, self.num_products), show_progress=False,
                                           n_threads=0)
        return [int(d) for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
