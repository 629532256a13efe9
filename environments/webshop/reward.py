"""WebShop's reward for buying a product with some chosen options, against a goal.

    R = (attributes matched + options matched + price term) / (|A| + |O| + 1) × r_type

- attribute matched: some product attribute has fuzzy token-set ratio > 85 with it (rapidfuzz), else it
  occurs (lower-cased) in the product's title, bullet points or description;
- option matched: some chosen option value, colour-normalised, has token-set ratio > 85 with the
  colour-normalised goal value;
- price term: 1 if the paid price is <= the goal's price cap;
- r_type (product-type factor) from the share of the goal title's nouns found in the bought title, the
  search query and the breadcrumb levels (see `type_factor`).
Success iff R = 1.

Nouns. The original tags the goal title with a spaCy English model, which is not installable here. Our
substitute (`title_nouns`) is a small deterministic heuristic: lower-case word tokens of the title (hyphens
kept, so "t-shirt" is one word) that are (a) a known product-type head noun from our generator's vocabulary,
or (b) alphabetic, at least 3 letters, not in a list of function words, colours, sizes and common title
adjectives (vocabulary.NON_NOUN_WORDS), and not ending in a typical adjective/adverb suffix (-able, -ible,
-ful, -less, -ous, -ive, -ly, -ing, -ed). Why: product titles are noun phrases whose non-adjective content
words are overwhelmingly nouns (brand, product type, material-as-noun), so removing the closed classes we
know gives nearly the same set as a tagger, with no model, no download and the same answer on every machine.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from rapidfuzz import fuzz

from agentgym_opsd.environments.webshop.models import CATEGORY_SEPARATOR, Goal, Product
from agentgym_opsd.environments.webshop.vocabulary import COLORS, NON_NOUN_WORDS, PRODUCT_TYPE_NOUNS

__all__ = ["RewardBreakdown", "score_purchase", "attribute_matches", "option_matches", "price_ok",
           "type_factor", "title_nouns", "normalize_color", "FUZZY_THRESHOLD"]

FUZZY_THRESHOLD = 85.0
"""A fuzzy match needs a token-set ratio strictly above this (0..100)."""

_WORD = re.compile(r"[a-z0-9][a-z0-9'\-]*")
_ADJ_SUFFIXES = ("able", "ible", "ful", "less", "ous", "ive", "ly", "ing", "ed")
_COLOR_PATTERNS = [(c, re.compile(rf"\b{re.escape(c)}\b")) for c in COLORS]


@dataclass(frozen=True)
class RewardBreakdown:
    """Every term of the reward: counts matched / wanted, the price term, the type factor and the score."""

    attributes_matched: int
    attributes_total: int
    options_matched: int
    options_total: int
    price_ok: bool
    title_score: float
    r_type: float
    score: float

    @property
    def success(self) -> bool:
        return self.score >= 1.0


def normalize_color(text: str) -> str:
    """The first known colour word contained in `text` (as a whole word), else `text` lower-cased."""
    lowered = text.lower()
    for color, pattern in _COLOR_PATTERNS:
        if pattern.search(lowered):
            return color
    return lowered


def attribute_matches(goal_attributes: Iterable[str], product: Product) -> int:
    """How many goal attributes the product has (fuzzy against its attributes, else a text substring)."""
    text = " ".join([product.name, *product.features, product.description]).lower()
    matched = 0
    for wanted in goal_attributes:
        wanted_l = wanted.lower()
        if any(fuzz.token_set_ratio(wanted_l, a.lower()) > FUZZY_THRESHOLD for a in product.attributes):
            matched += 1
        elif wanted_l and wanted_l in text:
            matched += 1
    return matched


def option_matches(goal_options: Iterable[str], chosen_options: Iterable[str]) -> int:
    """How many goal option values are among the chosen ones (colour-normalised, fuzzy)."""
    chosen = [normalize_color(c) for c in chosen_options]
    matched = 0
    for wanted in goal_options:
        wanted_n = normalize_color(wanted)
        if any(fuzz.token_set_ratio(wanted_n, c) > FUZZY_THRESHOLD for c in chosen):
            matched += 1
    return matched


def price_ok(paid_price: float, price_upper: float) -> bool:
    return paid_price <= price_upper


def title_nouns(title: str) -> set[str]:
    """The noun substitute described in the module docstring."""
    nouns = set()
    for word in _WORD.findall(title.lower()):
        word = word.strip("-'")
        if word in PRODUCT_TYPE_NOUNS:
            nouns.add(word)
        elif (word.isalpha() and len(word) >= 3 and word not in NON_NOUN_WORDS
              and not word.endswith(_ADJ_SUFFIXES)):
            nouns.add(word)
    return nouns


def _title_score(goal_title: str, bought_title: str) -> float:
    nouns = title_nouns(goal_title)
    if not nouns:
        return 0.2
    bought_words = {w.strip("-'") for w in _WORD.findall(bought_title.lower())}
    return sum(1 for n in nouns if n in bought_words) / len(nouns)


def type_factor(goal: Goal, product: Product) -> tuple[float, float]:
    """(r_type, title_score). r_type starts at 1; 0.5 if neither the same query, nor >= 2 shared breadcrumb
    levels, nor title_score > 0.2; then 0.1 if title_score < 0.1; then 0 if title_score == 0."""
    title_score = _title_score(goal.name, product.name)
    query_match = bool(goal.query) and goal.query == product.query
    goal_levels = {lvl.strip().lower() for lvl in goal.product_category.split(CATEGORY_SEPARATOR.strip())}
    bought_levels = {lvl.strip().lower() for lvl in product.product_category.split(CATEGORY_SEPARATOR.strip())}
    category_match = len((goal_levels & bought_levels) - {""}) >= 2
    r_type = 1.0
    if not query_match and not category_match and not title_score > 0.2:
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, title_score


def score_purchase(goal: Goal, product: Product, chosen_options: Iterable[str],
                   paid_price: float | None = None) -> RewardBreakdown:
    """The reward for buying `product` with `chosen_options` (option values) at `paid_price`
    (the product's price when None)."""
    chosen = list(chosen_options)
    goal_options = list(goal.options.values())
    attrs = attribute_matches(goal.attributes, product)
    opts = option_matches(goal_options, chosen)
    cheap = price_ok(product.price if paid_price is None else paid_price, goal.price_upper)
    r_type, title_score = type_factor(goal, product)
    total = len(goal.attributes) + len(goal_options) + 1
    score = (attrs + opts + int(cheap)) / total * r_type
    return RewardBreakdown(attrs, len(goal.attributes), opts, len(goal_options), cheap, title_score, r_type,
                           round(min(max(score, 0.0), 1.0), 6))
