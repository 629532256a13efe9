"""WebShop's reward for buying a product with some chosen options, against a goal: the original's rule.

    R = (attributes matched + options matched + [paid price <= goal's price cap]) / (|A| + |O| + 1) × r_type

An attribute matches when a product attribute has fuzzy token-set ratio > 85 with it, else when it (not lower-cased)
is a substring of the lower-cased title, joined bullet points or description; an option, when a chosen value has
ratio > 85 with the goal value, both colour-normalised. r_type: `type_factor`; success iff R = 1. Fuzzy scores are
thefuzz 0.19's (`preprocess`: code points 128-255 dropped, non-word characters to spaces, lower-cased). Nouns: spaCy
`en_core_web_sm` NOUN/PROPN when loadable, as the original, else `heuristic_nouns` (known product-type nouns, or
alphabetic words of 3+ letters outside `NON_NOUN_WORDS` and without an adjective suffix), as `nouns=` or
`$AGENTGYM_OPSD_WEBSHOP_NOUNS` (auto | spacy | heuristic) picks. `get_reward` takes the original's dictionaries.
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.vocabulary import COLORS, NON_NOUN_WORDS, PRODUCT_TYPE_NOUNS

__all__ = ["RewardBreakdown", "score_purchase", "get_reward", "attribute_matches", "option_matches", "price_ok",
           "type_factor", "title_nouns", "heuristic_nouns", "normalize_color", "token_set_ratio",
           "preprocess", "resolve_noun_backend", "FUZZY_THRESHOLD", "NOUN_BACKENDS", "NOUNS_ENV",
           "SPACY_MODEL_ENV"]

FUZZY_THRESHOLD = 85
"""A fuzzy match needs an (integer) token-set ratio strictly above this (0..100)."""
NOUN_BACKENDS = ("auto", "spacy", "heuristic")
NOUNS_ENV = "AGENTGYM_OPSD_WEBSHOP_NOUNS"
SPACY_MODEL_ENV = "AGENTGYM_OPSD_WEBSHOP_SPACY_MODEL"
_DEFAULT_SPACY_MODEL = "en_core_web_sm"
_NOUN_TAGS = ("NOUN", "PROPN")
_CATEGORY_SPLIT = "›"

_LOG = logging.getLogger(__name__)
_WORD = re.compile(r"[a-z0-9][a-z0-9'\-]*")
_NON_WORD = re.compile(r"\W", re.UNICODE)
# thefuzz's "ascii" step deletes only the Latin-1 supplement; other non-ASCII letters survive as word chars.
_LATIN1_SUPPLEMENT = {code: None for code in range(128, 256)}
_ADJ_SUFFIXES = ("able", "ible", "ful", "less", "ous", "ive", "ly", "ing", "ed")


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


# ---- fuzzy matching ------------------------------------------------------------------------------------
def preprocess(text: object) -> str:
    """The text as the original's fuzzy scorer sees it (see the module docstring)."""
    string = text if isinstance(text, str) else str(text)
    return _NON_WORD.sub(" ", string.translate(_LATIN1_SUPPLEMENT)).lower().strip()


def _ratio(a: str, b: str) -> int:
    # Equal strings score 100 before the empty check, so two empty strings are a perfect match, as there.
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * difflib.SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(a: object, b: object) -> int:
    """The original's fuzzy token-set ratio, 0..100 (an integer)."""
    tokens_a, tokens_b = set(preprocess(a).split()), set(preprocess(b).split())
    if not tokens_a or not tokens_b:
        return 0
    common = " ".join(sorted(tokens_a & tokens_b))
    with_a = f"{common} {' '.join(sorted(tokens_a - tokens_b))}".strip()
    with_b = f"{common} {' '.join(sorted(tokens_b - tokens_a))}".strip()
    return max(_ratio(common, with_a), _ratio(common, with_b), _ratio(with_a, with_b))


def normalize_color(text: str) -> str:
    """The first colour of COLORS (alphabetical) that is a substring of `text` (case-sensitive), else `text`."""
    for color in COLORS:
        if color in text:
            return color
    return text


# ---- terms ---------------------------------------------------------------------------------------------
def _attribute_count(goal_attributes: Iterable[str], attributes: Iterable[str], title: str,
                     bullets: Sequence[str], description: str) -> int:
    attributes = list(attributes)
    fields = (title.lower(), " ".join(bullets).lower(), description.lower())
    matched = 0
    for wanted in goal_attributes:
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in attributes):
            matched += 1
        elif any(wanted in text for text in fields):  # `wanted` is not lower-cased: the original's rule
            matched += 1
    return matched


def attribute_matches(goal_attributes: Iterable[str], product: Product) -> int:
    """How many goal attributes the product has (fuzzy against its attributes, else a field substring)."""
    return _attribute_count(goal_attributes, product.attributes, product.name, product.features,
                            product.description)


def _option_count(goal_options: Iterable[object], chosen_options: Iterable[str]) -> int:
    chosen = [normalize_color(c) for c in chosen_options]
    matched = 0
    for wanted in goal_options:
        wanted_n = _normalize_goal_option(wanted)
        if any(token_set_ratio(c, wanted_n) > FUZZY_THRESHOLD for c in chosen):
            matched += 1
    return matched


def _normalize_goal_option(wanted: object) -> object:
    """Colour-normalise a goal option. The original hands dict goals' (name, value) *pairs* to the colour
    step, where `colour in pair` is an exact element test, and then to the fuzzy scorer as `str(pair)`;
    we keep that so `get_reward` agrees on dict-shaped (synthetic) goals too."""
    if isinstance(wanted, str):
        return normalize_color(wanted)
    for color in COLORS:
        if color in wanted:  # type: ignore[operator]
            return color
    return wanted


def option_matches(goal_options: Iterable[str], chosen_options: Iterable[str]) -> int:
    """How many goal option values are among the chosen ones (colour-normalised, fuzzy)."""
    return _option_count(goal_options, chosen_options)


def price_ok(paid_price: float, price_upper: float) -> bool:
    return paid_price <= price_upper


# ---- nouns ---------------------------------------------------------------------------------------------
def heuristic_nouns(title: str) -> list[str]:
    """The model-free noun stand-in described in the module docstring (duplicates kept, in order)."""
    nouns = []
    for word in _WORD.findall(title.lower()):
        word = word.strip("-'")
        if word in PRODUCT_TYPE_NOUNS:
            nouns.append(word)
        elif (word.isalpha() and len(word) >= 3 and word not in NON_NOUN_WORDS
              and not word.endswith(_ADJ_SUFFIXES)):
            nouns.append(word)
    return nouns


_SPACY_LOCK = threading.Lock()


def _spacy_pipeline(model: str) -> Any:
    """The loaded spaCy model, or None when spaCy or the model is missing (checked once per model and process:
    the environment pool's threads all score at once, and lru_cache alone lets each of them load and log)."""
    with _SPACY_LOCK:
        return _load_spacy(model)


@functools.lru_cache(maxsize=4)
def _load_spacy(model: str) -> Any:
    try:
        import spacy

        # The parser and NER do not change POS tags; skipping them only saves time.
        return spacy.load(model, exclude=["parser", "ner", "lemmatizer"])
    except Exception as error:  # ImportError, OSError (model not found), version mismatch, ...
        _LOG.info("spaCy model %r not loadable (%s); WebShop reward uses the noun heuristic", model, error)
        return None


def _spacy_model_name() -> str:
    return os.environ.get(SPACY_MODEL_ENV) or _DEFAULT_SPACY_MODEL


def resolve_noun_backend(nouns: str | None = None) -> str:
    """"spacy" or "heuristic": what `nouns` (or the environment variable, default "auto") selects here."""
    wanted = nouns or os.environ.get(NOUNS_ENV) or "auto"
    if wanted not in NOUN_BACKENDS:
        raise ValueError(f"noun backend must be one of {NOUN_BACKENDS}, got {wanted!r}")
    if wanted == "heuristic":
        return "heuristic"
    if _spacy_pipeline(_spacy_model_name()) is not None:
        return "spacy"
    if wanted == "spacy":
        raise RuntimeError(f"noun backend 'spacy' needs spaCy and the model {_spacy_model_name()!r} "
                           f"(install them, or set {SPACY_MODEL_ENV})")
    return "heuristic"


def title_nouns(title: str, nouns: str | None = None) -> list[str]:
    """The title's nouns, lower-cased, duplicates kept (spaCy NOUN/PROPN tokens, or the heuristic)."""
    if resolve_noun_backend(nouns) == "heuristic":
        return heuristic_nouns(title)
    return list(_spacy_nouns(_spacy_model_name(), title))


@functools.lru_cache(maxsize=8192)
def _spacy_nouns(model: str, title: str) -> tuple[str, ...]:
    # Titles repeat across purchases (the goal's title every time), and tagging is the slow part.
    return tuple(token.text.lower() for token in _spacy_pipeline(model)(title) if token.pos_ in _NOUN_TAGS)


def _type_factor(goal_name: str, goal_query: str, goal_category: str, bought_name: str, bought_query: str,
                 bought_category: str, nouns: str | None) -> tuple[float, float]:
    wanted = title_nouns(goal_name, nouns)
    bought = set(title_nouns(bought_name, nouns))
    # Duplicated goal nouns count in the denominator only once matched: the original's rule.
    title_score = len(bought & set(wanted)) / len(wanted) if wanted else 0.2
    query_match = bought_query == goal_query
    goal_levels = {level.strip() for level in goal_category.split(_CATEGORY_SPLIT)}
    bought_levels = {level.strip() for level in bought_category.split(_CATEGORY_SPLIT)}
    category_match = len(goal_levels & bought_levels) >= 2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, title_score


def type_factor(goal: Goal, product: Product, nouns: str | None = None) -> tuple[float, float]:
    """(r_type, title_score). title_score = |bought-title nouns ∩ goal-title nouns| / (number of goal-title
    nouns, duplicates counted), 0.2 when the goal title has none. r_type starts at 1; 0.5 if neither the
    same query, nor >= 2 shared breadcrumb levels, nor title_score > 0.2; then 0.1 if title_score < 0.1;
    then 0 if title_score == 0."""
    return _type_factor(goal.name, goal.query, goal.product_category, product.name, product.query,
                        product.product_category, nouns)


# ---- the score -----------------------------------------------------------------------------------------
def score_purchase(goal: Goal, product: Product, chosen_options: Iterable[str],
                   paid_price: float | None = None, nouns: str | None = None) -> RewardBreakdown:
    """The reward for buying `product` with `chosen_options` (option values) at `paid_price`
    (the product's price when None). Goal options are scored as a list of values, as for the original's
    human goals."""
    chosen = list(chosen_options)
    goal_options = list(goal.options.values())
    attrs = attribute_matches(goal.attributes, product)
    opts = option_matches(goal_options, chosen)
    cheap = _price_term(product.price if paid_price is None else paid_price, goal.price_upper)
    r_type, title_score = type_factor(goal, product, nouns)
    total = len(goal.attributes) + len(goal_options) + 1
    score = (attrs + opts + int(cheap)) / total * r_type
    return RewardBreakdown(attrs, len(goal.attributes), opts, len(goal_options), cheap, title_score, r_type,
                           score)


def _price_term(price: float, price_upper: float) -> bool:
    # The original has no price term for a cap <= 0 (and then fails adding None); we count it as missed.
    return price_upper > 0 and price_ok(price, price_upper)


def get_reward(purchased_product: Mapping[str, Any], goal: Mapping[str, Any], price: float,
               options: Mapping[str, str], *, nouns: str | None = None,
               verbose: bool = False) -> float | tuple[float, dict[str, Any]]:
    """The original's `get_reward` on its dictionaries: `purchased_product` with `Title`, `BulletPoints`,
    `Description`, `Attributes`, `query`, `product_category`, `name`; `goal` with `attributes`,
    `goal_options` (a list of values, or a dict name -> value), `price_upper`, `query`, `product_category`,
    `name`; `price` paid; `options` chosen (name -> value). With `verbose`, (score, terms) like the original."""
    goal_attributes = list(goal["attributes"])
    raw_options = goal["goal_options"]
    goal_options = list(raw_options.items()) if isinstance(raw_options, Mapping) else list(raw_options)
    attrs = _attribute_count(goal_attributes, purchased_product["Attributes"], purchased_product["Title"],
                             purchased_product["BulletPoints"], purchased_product["Description"])
    opts = _option_count(goal_options, list(options.values()))
    cheap = _price_term(price, goal["price_upper"])
    r_type, title_score = _type_factor(goal["name"], goal["query"], goal["product_category"],
                                       purchased_product["name"], purchased_product["query"],
                                       purchased_product["product_category"], nouns)
    total = len(goal_attributes) + len(goal_options) + 1
    score = (attrs + opts + int(cheap)) / total * r_type
    if not verbose:
        return score
    info: dict[str, Any] = {"r_type": r_type, "r_att": attrs / len(goal_attributes) if goal_attributes else None,
                            "title_score": title_score, "r_price": cheap, "w_price": 1 / total,
                            "w_att": len(goal_attributes) / total}
    if goal_options:
        info.update(r_option=opts / len(goal_options), w_option=len(goal_options) / total)
    return score, info
