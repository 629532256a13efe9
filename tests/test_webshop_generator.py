"""The offline catalogue and instruction generator."""

from __future__ import annotations

import random

from agentgym_opsd.environments.webshop.generator import (
    generate_goals,
    generate_products,
    make_asin,
    price_cap,
)
from agentgym_opsd.environments.webshop.vocabulary import CATEGORIES


def test_deterministic_and_prefix_stable() -> None:
    a, b = generate_products(300, seed=1), generate_products(300, seed=1)
    assert a == b
    assert generate_products(100, seed=1) == a[:100]
    assert generate_products(50, seed=2)[0] != a[0]
    assert generate_goals(a, seed=1) == generate_goals(b, seed=1)


def test_products_are_complete_and_unique() -> None:
    products = generate_products(2000, seed=0)
    assert len({p.asin for p in products}) == len(products)
    assert {p.category for p in products} == set(CATEGORIES)
    for p in products[:400]:
        assert p.name and p.features and p.description and p.attributes and p.price > 0
        assert p.asin.startswith("B0") and len(p.asin) == 10
        values = p.option_values()
        assert len(values) == len(set(values)), "option values must be distinct to be clickable"
        assert p.product_type in p.name.lower()


def test_asin_bijective_on_a_range() -> None:
    assert len({make_asin(i, 3) for i in range(50_000)}) == 50_000


def test_goals_follow_their_target() -> None:
    products = generate_products(500, seed=0)
    by_asin = {p.asin: p for p in products}
    splits = generate_goals(products, seed=0)
    assert len(splits["test"]) == 50 and len(splits["train"]) == 450
    assert not {g.asin for g in splits["test"]} & {g.asin for g in splits["train"]}
    for goal in splits["train"] + splits["test"]:
        target = by_asin[goal.asin]
        assert set(goal.attributes) <= set(target.attributes) and 1 <= len(goal.attributes) <= 3
        assert set(goal.options) == set(target.options)
        for group, value in goal.options.items():
            assert value in target.options[group] and value in goal.instruction
        assert goal.price_upper > target.price
        assert f"{goal.price_upper:.2f} dollars" in goal.instruction
        assert goal.category == target.category


def test_price_cap_rule() -> None:
    rng = random.Random(0)
    caps = {price_cap(23.5, rng) for _ in range(200)}
    # first four values above 23.5 are 30, 40, 50, 60; the larger of two distinct picks is never 30
    assert caps == {40.0, 50.0, 60.0}
    assert price_cap(995.0, rng) == 1005.0
