"""Page content: what each page of the shop shows, as an ordered list of segments.

A page is built once as segments; the text observation joins their texts with " [SEP] " and the HTML
template renders the same segments (each marked `data-obs`, clickables also `data-click`). So text mode and
browser mode read the same strings in the same order by construction, and a test checks it in Chromium.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agentgym_opsd.environments.webshop.models import Goal, Product

__all__ = ["Segment", "Page", "SEP", "search_page", "results_page", "item_page", "detail_page", "done_page",
           "normalize_text", "price_text", "rating_text", "PAGE_KINDS", "DETAIL_KINDS", "BACK_TO_SEARCH", "PREV", "NEXT", "BUY_NOW"]

SEP = " [SEP] "
PAGE_KINDS = ("search", "results", "item", "detail", "done")
DETAIL_KINDS = ("description", "features", "reviews")
BACK_TO_SEARCH = "Back to Search"
PREV = "< Prev"
NEXT = "Next >"
BUY_NOW = "Buy Now"


def normalize_text(text: str) -> str:
    """Whitespace collapsed to single spaces (the browser's textContent is normalised the same way)."""
    return " ".join(text.split())


def price_text(prices: Sequence[float]) -> str:
    """A price as the original prints it: Python's float text after "$" ("$19.99", "$100.0"), a range as
    "$24.49 to $39.99"."""
    return " to ".join(f"${float(p)}" for p in prices[:2])


def rating_text(rating: float | None) -> str:
    """The rating value as the original's template prints it; "N.A." when there is none (the original's
    loader never fills ratings, so there every product shows N.A.)."""
    return "N.A." if rating is None else str(rating)


@dataclass(frozen=True)
class Segment:
    """One visible string. `click` is the name `click[...]` uses (lower-cased) when the segment is
    clickable; `role` lets the template lay segments out (heading, nav, result-id, option, …);
    `selected` marks a chosen option; `group` is the option group of an option."""

    text: str
    role: str = "text"
    click: str | None = None
    selected: bool = False
    group: str = ""


@dataclass(frozen=True)
class Page:
    """One rendered page. `has_search` is True when the search bar is shown (search[...] allowed);
    `score` is the purchase score on the done page."""

    kind: str
    segments: tuple[Segment, ...]
    has_search: bool = False
    score: float | None = None
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def clickables(self) -> list[str]:
        return [s.click for s in self.segments if s.click is not None]

    def observation(self) -> str:
        return SEP.join(normalize_text(s.text) for s in self.segments)


def _clickable(text: str, role: str, **kw: object) -> Segment:
    return Segment(text=text, role=role, click=normalize_text(text).lower(), **kw)  # type: ignore[arg-type]


def _instruction(goal: Goal) -> list[Segment]:
    return [Segment("Instruction:", "instruction-label"), Segment(goal.instruction, "instruction")]


def search_page(goal: Goal) -> Page:
    segments = [Segment("WebShop", "heading"), *_instruction(goal), Segment("Search", "search-button")]
    return Page("search", tuple(segments), has_search=True)


def results_page(goal: Goal, products: list[Product], page_num: int, total: int, per_page: int) -> Page:
    """`products` are the ones on this page; `page_num` counts from 1. "Next >" is on every results page,
    the last one included (it then leads to an empty page), as in the original; `per_page` and `total`
    only label the page."""
    del per_page
    segments = [*_instruction(goal), _clickable(BACK_TO_SEARCH, "nav"),
                Segment(f"Page {page_num} (Total results: {total})", "page-info")]
    if page_num > 1:
        segments.append(_clickable(PREV, "nav"))
    segments.append(_clickable(NEXT, "nav"))
    for product in products:
        segments += [_clickable(product.asin, "result-id"), Segment(product.name, "result-title"),
                     Segment(price_text(product.listed_prices), "result-price")]
    return Page("results", tuple(segments))


def item_page(goal: Goal, product: Product, chosen: dict[str, str]) -> Page:
    segments = [*_instruction(goal), _clickable(BACK_TO_SEARCH, "nav"), _clickable(PREV, "nav")]
    for group, values in product.options.items():
        segments.append(Segment(group, "option-group"))
        segments += [_clickable(v, "option", selected=chosen.get(group) == v, group=group) for v in values]
    segments += [Segment(product.name, "title"), Segment(f"Price: {price_text(product.listed_prices)}", "price"),
                 Segment(f"Rating: {rating_text(product.rating)}", "rating")]
    segments += [_clickable(kind.capitalize(), "tab") for kind in DETAIL_KINDS]
    segments.append(_clickable(BUY_NOW, "buy"))
    return Page("item", tuple(segments), meta={"asin": product.asin})


def detail_page(goal: Goal, product: Product, kind: str) -> Page:
    if kind not in DETAIL_KINDS:
        raise ValueError(f"detail page kind must be one of {DETAIL_KINDS}, got {kind!r}")
    # Empty texts are left out (the original's pages show nothing there, and an empty segment would add a
    # bare [SEP]); a review shows its quoted title, its star count and its body, as there.
    segments = [*_instruction(goal), _clickable(BACK_TO_SEARCH, "nav"), _clickable(PREV, "nav")]
    if kind == "description":
        segments += [Segment(product.description, "body")] if product.description.strip() else []
    elif kind == "features":
        segments += [Segment(f, "bullet") for f in product.features if f.strip()]
    else:
        for review in product.reviews:
            segments += [Segment(f'"{review.title}"', "review-title"), Segment(str(review.rating), "review-rating"),
                         Segment(review.body, "review-body")]
    return Page("detail", tuple(segments), meta={"asin": product.asin, "detail": kind})


def done_page(goal: Goal, product: Product, chosen: dict[str, str], score: float) -> Page:
    options_text = ", ".join(f"{g}: {v}" for g, v in chosen.items()) or "none"
    segments = [Segment("Thank you for shopping with us!", "heading"), Segment(f"Purchased: {product.name}", "body"),
                Segment(f"Options: {options_text}", "body"), Segment("Your score (min 0.0, max 1.0)", "body"),
                Segment(f"{score:.4f}".rstrip("0").rstrip(".") if score not in (0.0, 1.0) else f"{score:.1f}",
                        "score")]
    return Page("done", tuple(segments), score=score, meta={"asin": product.asin})
