"""Each term of the WebShop reward."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.reward import (
    NOUNS_ENV,
    attribute_matches,
    normalize_color,
    option_matches,
    price_ok,
    score_purchase,
    title_nouns,
    type_factor,
)


@pytest.fixture(autouse=True)
def heuristic_nouns(monkeypatch: pytest.MonkeyPatch) -> None:
    """These values are computed with the model-free noun heuristic, whether or not spaCy is installed."""
    monkeypatch.setenv(NOUNS_ENV, "heuristic")

PRODUCT = Product(
    asin="B0TEST0001", name="Northwind Classic T-Shirt - Cotton, Slim Fit", category="apparel",
    product_category="Clothing › Men › Shirts › T-Shirts", query="men's t-shirts", product_type="t-shirt",
    price=19.99, features=("Machine wash cold.", "Breathable fabric for the gym."),
    description="A soft everyday tee with a crew neck.", attributes=("cotton", "slim fit", "short sleeve"),
    options={"color": ("navy blue", "heather grey"), "size": ("medium", "large")},
)
GOAL = Goal(
    goal_id="t-0", asin=PRODUCT.asin, instruction="...", category="apparel", name=PRODUCT.name,
    query=PRODUCT.query, product_category=PRODUCT.product_category, attributes=("cotton", "short sleeve"),
    options={"color": "navy blue", "size": "large"}, price_upper=30.0,
)


def test_attribute_fuzzy_and_substring() -> None:
    assert attribute_matches(["cotton"], PRODUCT) == 1  # exact attribute
    assert attribute_matches(["short sleeves"], PRODUCT) == 1  # fuzzy > 85
    assert attribute_matches(["machine wash"], PRODUCT) == 1  # substring of a bullet point
    assert attribute_matches(["crew neck"], PRODUCT) == 1  # substring of the description
    assert attribute_matches(["waterproof"], PRODUCT) == 0
    assert attribute_matches(["cotton", "waterproof", "slim fit"], PRODUCT) == 2


def test_color_normalisation_and_options() -> None:
    # The original's rule: the alphabetically first colour that is a (case-sensitive) substring.
    assert normalize_color("navy blue") == "blue"
    assert normalize_color("Navy Blue") == "Navy Blue"  # no lower-case colour inside
    assert normalize_color("heather grey") == "grey"
    assert normalize_color("x-large") == "x-large"
    assert option_matches(["navy blue", "large"], ["navy blue", "large"]) == 2
    assert option_matches(["navy"], ["navy blue"]) == 0  # navy vs blue
    assert option_matches(["blue"], ["navy blue"]) == 1  # both normalise to blue
    assert option_matches(["large"], ["x-large"]) == 1  # "x large" vs "large": token subset, 100
    assert option_matches(["large"], []) == 0


def test_price_term() -> None:
    assert price_ok(19.99, 30.0) and price_ok(30.0, 30.0) and not price_ok(30.01, 30.0)


def test_title_nouns_substitute() -> None:
    nouns = title_nouns("Northwind Classic T-Shirt - Cotton, Slim Fit for Everyday Wear", "heuristic")
    assert "t-shirt" in nouns and "northwind" in nouns
    assert not {"classic", "cotton", "slim", "fit", "for"} & set(nouns)
    assert title_nouns("soft red slim", "heuristic") == []
    assert title_nouns("Kestrel Boots Kestrel", "heuristic") == ["kestrel", "boots", "kestrel"]


def test_type_factor_levels() -> None:
    assert type_factor(GOAL, PRODUCT) == (1.0, 1.0)
    other = dataclasses.replace(PRODUCT, name="Kestrel Hiking Boots", query="boots",
                                product_category="Shoes › Men › Boots")
    assert type_factor(GOAL, other)[0] == 0.0  # no goal noun in the title
    # goal title with 10 nouns; the bought title shares some of them
    goal = dataclasses.replace(GOAL, name="Kestrel Boots Jacket Hat Scarf Glove Sock Tie Belt Cap")
    assert len(title_nouns(goal.name)) == 10
    low = dataclasses.replace(other, name="Kestrel")  # 1/10 = 0.1: not < 0.1, and not > 0.2 -> 0.5
    assert type_factor(goal, low) == (0.5, 0.1)
    lower = dataclasses.replace(goal, name=goal.name + " Mitten")  # 1/11 < 0.1 -> 0.1
    assert type_factor(lower, low) == (0.1, 1 / 11)
    mid = dataclasses.replace(other, name="Kestrel Boots")  # 2/10: no query/category/title match -> 0.5
    assert type_factor(goal, mid)[0] == 0.5
    high = dataclasses.replace(other, name="Kestrel Boots Jacket")  # 3/10 > 0.2 -> 1.0
    assert type_factor(goal, high) == (1.0, 0.3)
    same_category = dataclasses.replace(mid, product_category=GOAL.product_category)
    assert type_factor(goal, same_category)[0] == 1.0
    same_query = dataclasses.replace(mid, query=goal.query)
    assert type_factor(goal, same_query)[0] == 1.0
    no_nouns = dataclasses.replace(GOAL, name="soft red slim")
    assert type_factor(no_nouns, other) == (0.5, 0.2)


def test_full_score() -> None:
    perfect = score_purchase(GOAL, PRODUCT, ["navy blue", "large"])
    assert perfect.score == 1.0 and perfect.success
    one_option = score_purchase(GOAL, PRODUCT, ["navy blue"])
    assert one_option.score == round(4 / 5, 6) and not one_option.success
    pricey = score_purchase(GOAL, PRODUCT, ["navy blue", "large"], paid_price=45.0)
    assert pricey.score == round(4 / 5, 6) and not pricey.price_ok


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=20), max_size=4), st.lists(st.text(max_size=20), max_size=4),
       st.floats(min_value=0, max_value=2000, allow_nan=False))
def test_score_always_in_unit_interval(attrs: list[str], chosen: list[str], price: float) -> None:
    goal = dataclasses.replace(GOAL, attributes=tuple(attrs))
    breakdown = score_purchase(goal, PRODUCT, chosen, paid_price=price)
    assert 0.0 <= breakdown.score <= 1.0
