"""The shop: a catalogue, its search engine and its goals, shared read-only by every session.

`load_shop(...)` memoises shops by their arguments: a shop is immutable after construction, so sharing it
between environments of one process is safe and saves rebuilding the BM25 index per environment.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from agentgym_opsd.environments.webshop.generator import generate_goals, generate_products
from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.search import ProductSearch

__all__ = ["Shop", "load_shop", "DEFAULT_NUM_PRODUCTS", "RESULTS_PER_PAGE", "MAX_RESULTS"]

DEFAULT_NUM_PRODUCTS = 2000
"""Default generated catalogue: big enough for distractors in every category, small enough that the first
environment builds it (generation + BM25 index) in well under a few seconds."""
RESULTS_PER_PAGE = 10
MAX_RESULTS = 50


class Shop:
    """Products (by position and by asin), a search engine over them, and goals per split."""

    def __init__(self, products: Sequence[Product], goals: dict[str, list[Goal]]) -> None:
        self.products = list(products)
        self.by_asin = {p.asin: p for p in self.products}
        if len(self.by_asin) != len(self.products):
            raise ValueError("product asins must be unique")
        for split, split_goals in goals.items():
            missing = [g.asin for g in split_goals if g.asin not in self.by_asin]
            if missing:
                raise ValueError(f"{len(missing)} goals of split {split!r} name unknown products, e.g. {missing[0]}")
        self.goals = {split: list(v) for split, v in goals.items()}
        self.search_engine = ProductSearch(self.products)

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.goals)

    def split_goals(self, split: str) -> list[Goal]:
        if split not in self.goals:
            raise ValueError(f"unknown split {split!r}; this shop has {', '.join(self.goals)}")
        return self.goals[split]

    def search(self, query: str) -> list[Product]:
        """Up to MAX_RESULTS products for the query, best first."""
        return [self.products[i] for i in self.search_engine.search(query, k=MAX_RESULTS)]

    @classmethod
    def generated(cls, num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0) -> Shop:
        products = generate_products(num_products, seed)
        return cls(products, generate_goals(products, seed))


@functools.lru_cache(maxsize=4)
def load_shop(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0, data_dir: str | None = None) -> Shop:
    """The generated shop for (num_products, seed), or the real WebShop data in `data_dir` (see loaders.py;
    `$AGENTGYM_OPSD_WEBSHOP_DATA` is used when data_dir is None and the variable is set)."""
    data_dir = data_dir or os.environ.get("AGENTGYM_OPSD_WEBSHOP_DATA")
    if data_dir:
        from agentgym_opsd.environments.webshop.loaders import load_real_shop_data

        products, goals = load_real_shop_data(Path(data_dir), seed=seed)
        return Shop(products, goals)
    return Shop.generated(num_products, seed)
