"""A deterministic offline catalogue and instruction generator (the original product data cannot be
downloaded here).

`generate_products(n, seed)` makes n products spread evenly over the categories of vocabulary.CATEGORIES;
`generate_goals(products, seed)` makes one instruction per product from the product's attributes, one value
per option group and a price cap, and splits them into train/test. The same (n, seed) always gives the same
catalogue; product i depends only on (seed, i), so catalogues of different sizes share their first products.
"""

from __future__ import annotations

import random

from agentgym_opsd.environments.webshop.models import CATEGORY_SEPARATOR, Goal, Product, Review
from agentgym_opsd.environments.webshop.vocabulary import BRANDS, CATEGORIES, CategorySpec

__all__ = ["generate_products", "generate_goals", "price_cap", "make_asin", "SPLITS", "TEST_EVERY"]

SPLITS = ("train", "test")
TEST_EVERY = 10
"""Goal i goes to the test split when i % TEST_EVERY == 0 (10% test), else to train."""

_ASIN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASIN_SPACE = 36**8
# An odd multiplier not divisible by 3 is coprime with 36**8, so index -> asin is a bijection (ids unique).
_ASIN_MULTIPLIER = 2654435761


def make_asin(index: int, seed: int) -> str:
    """A unique, stable product id like the original's ("B0" + 8 base-36 characters)."""
    value = (index * _ASIN_MULTIPLIER + seed * 7919 + 12345) % _ASIN_SPACE
    chars = []
    for _ in range(8):
        value, digit = divmod(value, 36)
        chars.append(_ASIN_ALPHABET[digit])
    return "B0" + "".join(reversed(chars))


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _make_reviews(rng: random.Random, noun: str, attrs: list[str]) -> tuple[Review, ...]:
    stems = [
        (5, "Love it", f"This {noun} is exactly what I wanted. The {attrs[0]} part really shows."),
        (4, "Pretty good", f"Good {noun} for the price; {attrs[-1]} as described, shipping was quick."),
        (3, "It's okay", f"The {noun} does the job, but I expected a little more for what it costs."),
        (2, "Not for me", f"The {noun} looked different from the pictures and I sent it back."),
        (5, "Would buy again", f"Second {noun} I bought from this brand, and it holds up well."),
    ]
    picked = rng.sample(stems, rng.randint(0, 3))
    return tuple(Review(rating, title, body) for rating, title, body in picked)


def _make_product(index: int, seed: int, spec: CategorySpec) -> Product:
    rng = random.Random(seed * 1_000_003 + index)
    ptype = spec.types[rng.randrange(len(spec.types))]
    brand = BRANDS[rng.randrange(len(BRANDS))]
    attrs = rng.sample(spec.attributes, rng.randint(3, 5))
    options: dict[str, tuple[str, ...]] = {}
    for group, values in spec.option_groups.items():
        if rng.random() < 0.85:  # some products have no choice in a group
            count = min(len(values), rng.randint(2, 6))
            picked = sorted(rng.sample(range(len(values)), count))
            options[group] = tuple(values[i] for i in picked)
    adjective = spec.adjectives[rng.randrange(len(spec.adjectives))]
    title_attr = attrs[0]
    name = f"{brand} {_sentence(adjective)} {ptype.noun.title()} - {title_attr.title()}, {attrs[1].title()}"
    if rng.random() < 0.5:
        name += f" for {rng.choice(spec.uses).title()}"
    low, high = spec.price_range
    price = round(rng.uniform(low, high), 0) - 0.01 if rng.random() < 0.7 else round(rng.uniform(low, high), 2)
    price = max(price, 0.99)
    use = rng.choice(spec.uses)
    features = (
        f"{_sentence(attrs[0])}: designed so you notice it from the first day.",
        f"{_sentence(attrs[1])} and {attrs[2]} for {use}.",
        *(f"{_sentence(a)}." for a in attrs[3:]),
        f"Backed by {brand} customer support; contact us with any question.",
    )
    description = (
        f"The {brand} {ptype.noun} is a {adjective} choice for {use}. "
        f"It is {attrs[1]} and {attrs[2]}, and comes in {len(options.get('color', ())) or 'one'} "
        f"colour choices. {_sentence(rng.choice(spec.uses))} or {rng.choice(spec.uses)}: it fits both."
    )
    reviews = _make_reviews(rng, ptype.noun, attrs)
    rating = round(sum(r.rating for r in reviews) / len(reviews), 1) if reviews else None
    return Product(
        asin=make_asin(index, seed),
        name=name,
        category=spec.name,
        product_category=CATEGORY_SEPARATOR.join([spec.root, *ptype.subcategory.split(" › ")]),
        query=ptype.query,
        product_type=ptype.noun,
        price=float(price),
        features=features,
        description=description,
        reviews=reviews,
        attributes=tuple(attrs),
        options=options,
        rating=rating,
    )


def generate_products(num_products: int, seed: int = 0) -> list[Product]:
    """`num_products` products, category i % len(CATEGORIES) for product i (balanced task types)."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    specs = list(CATEGORIES.values())
    return [_make_product(i, seed, specs[i % len(specs)]) for i in range(num_products)]


def price_cap(price: float, rng: random.Random) -> float:
    """WebShop's cap: of the first four of 10, 20, …, 990 above the price, pick two, keep the larger."""
    above = [float(v) for v in range(10, 1000, 10) if v > price][:4]
    if not above:
        return float(int(price) + 10)
    return max(rng.sample(above, min(2, len(above))))


def _instruction_text(rng: random.Random, product: Product, attrs: list[str], options: dict[str, str],
                      cap: float) -> str:
    noun = product.product_type
    # plural product types ("jeans", "sneakers") take no article
    article = "" if noun.endswith("s") and not noun.endswith("ss") else ("an " if noun[0] in "aeiou" else "a ")
    attr_text = " and ".join(attrs)
    opts = ", ".join(f"{group}: {value}" for group, value in options.items())
    opt_clause = f" with {opts}" if opts else ""
    templates = (
        f"i need {article}{noun} that is {attr_text}{opt_clause}, and price lower than {cap:.2f} dollars",
        f"i am looking for {attr_text} {noun}{opt_clause}, and price lower than {cap:.2f} dollars",
        f"find me {article}{attr_text} {noun}{opt_clause}, and price lower than {cap:.2f} dollars",
        f"i want to buy {article}{noun} which is {attr_text}{opt_clause}, and price lower than {cap:.2f} dollars",
    )
    return templates[rng.randrange(len(templates))]


def _make_goal(goal_id: str, product: Product, rng: random.Random) -> Goal:
    attrs = rng.sample(list(product.attributes), min(len(product.attributes), rng.randint(1, 3)))
    options = {group: values[rng.randrange(len(values))] for group, values in product.options.items()}
    cap = price_cap(product.price, rng)
    return Goal(
        goal_id=goal_id,
        asin=product.asin,
        instruction=_instruction_text(rng, product, attrs, options, cap),
        category=product.category,
        name=product.name,
        query=product.query,
        product_category=product.product_category,
        attributes=tuple(attrs),
        options=options,
        price_upper=cap,
    )


def generate_goals(products: list[Product], seed: int = 0) -> dict[str, list[Goal]]:
    """One goal per product; {"train": [...], "test": [...]} with every TEST_EVERY-th goal in test."""
    splits: dict[str, list[Goal]] = {name: [] for name in SPLITS}
    for i, product in enumerate(products):
        split = "test" if i % TEST_EVERY == 0 else "train"
        rng = random.Random(seed * 7_000_003 + i + 1)
        splits[split].append(_make_goal(f"{split}-{len(splits[split])}", product, rng))
    return splits
