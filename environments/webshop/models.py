"""Data between the WebShop modules: products, goals (instructions) and reviews.

These follow the fields of the original WebShop files (`items_shuffle*.json`, `items_ins_v2*.json`) closely
enough that a loader can fill them from the real data, and our generator fills them from its own tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Review", "Product", "Goal", "CATEGORY_SEPARATOR"]

CATEGORY_SEPARATOR = " › "
"""Separator between the levels of `Product.product_category` (as in the original data)."""


@dataclass(frozen=True)
class Review:
    """One customer review: `rating` in 1..5 stars, `title` and `body` free text."""

    rating: int
    title: str
    body: str


@dataclass(frozen=True)
class Product:
    """One item of the catalogue.

    `asin` is the product id shown on the results page (upper case; the agent clicks it lower-cased).
    `name` is the title; `features` are the bullet points ("small description"); `attributes` are short
    phrases the reward matches instruction attributes against; `options` maps an option group ("color",
    "size") to its values in display order; `price` is in dollars; `category` is our top-level category
    (the env's task type), `product_category` the breadcrumb path joined by CATEGORY_SEPARATOR, `query`
    the search query the original crawl found the product with; `product_type` the head noun ("t-shirt").
    """

    asin: str
    name: str
    category: str
    product_category: str
    query: str
    product_type: str
    price: float
    features: tuple[str, ...] = ()
    description: str = ""
    reviews: tuple[Review, ...] = ()
    attributes: tuple[str, ...] = ()
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rating: float | None = None
    price_range: tuple[float, ...] = ()  # the listed price(s): one, or a low-high range (real data); () = (price,)

    @property
    def listed_prices(self) -> tuple[float, ...]:
        """What the pages show: the range the data lists, else the one price."""
        return self.price_range or (self.price,)

    def option_values(self) -> list[str]:
        return [v for values in self.options.values() for v in values]


@dataclass(frozen=True)
class Goal:
    """One instruction: buy `asin` (or any product that satisfies it equally well).

    `attributes` must each match the bought product; `options` maps option group -> wanted value (each must
    be among the chosen options); the paid price must be <= `price_upper`. `name`, `query` and
    `product_category` are the target's, used by the reward's product-type factor. `goal_id` is stable
    across runs ("<split>-<index>" for generated goals).
    """

    goal_id: str
    asin: str
    instruction: str
    category: str
    name: str
    query: str
    product_category: str
    attributes: tuple[str, ...]
    options: dict[str, str]
    price_upper: float

    def to_json(self) -> dict[str, Any]:
        return {"goal_id": self.goal_id, "asin": self.asin, "instruction": self.instruction,
                "category": self.category, "attributes": list(self.attributes), "options": dict(self.options),
                "price_upper": self.price_upper}
