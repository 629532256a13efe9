"""Product search: BM25 (the `bm25s` library) over each product's text.

The original runs Lucene through pyserini (Java); BM25 with Lucene's English stop words and pyserini's
default parameters (k1 = 0.9, b = 0.4) is the same ranking family and needs nothing outside PyPI. What is
indexed is what the original indexes (`index_text`): title, description, first bullet point and the option
lists — not the hidden attributes the reward checks, nor the product id. Known difference: Lucene also
Porter-stems words ("shirts" finds "shirt"); we do not stem.
"""

from __future__ import annotations

from collections.abc import Sequence

import bm25s

from agentgym_opsd.environments.webshop.models import Product

__all__ = ["ProductSearch", "MAX_QUERY_TOKENS", "index_text", "BM25_K1", "BM25_B"]

BM25_K1 = 0.9
BM25_B = 0.4
"""pyserini's default BM25 parameters (the original searches with them)."""

MAX_QUERY_TOKENS = 64
"""Longer queries are cut to their first 64 known tokens (a huge query would only cost time)."""


def index_text(product: Product) -> str:
    """The searchable text of a product, the fields the original indexes: title, description, first bullet
    point, then "group: value, value, and group: value, ..." for the options."""
    options = ", and ".join(f"{group}: {', '.join(values)}" for group, values in product.options.items())
    parts = [product.name, product.description, product.features[0] if product.features else "", options]
    return " ".join(parts).lower()


class ProductSearch:
    """Top-k product indices for a free-text query; results with a zero score are dropped."""

    def __init__(self, products: Sequence[Product]) -> None:
        if not products:
            raise ValueError("ProductSearch needs at least one product")
        self.num_products = len(products)
        corpus_tokens = bm25s.tokenize([index_text(p) for p in products], stopwords="en", show_progress=False)
        # numpy, as before numba was installed (vLLM's CPU build brings it): the same ranking, no JIT compile
        self._bm25 = bm25s.BM25(k1=BM25_K1, b=BM25_B, backend="numpy")
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
