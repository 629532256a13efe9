"""Shared builders for the WebShop tests (small shops, a product with hostile text); no tests here."""

from __future__ import annotations

from agentgym_opsd.environments.webshop.generator import generate_goals, generate_products
from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.shop import Shop

SMALL = 240

HOSTILE_NAME = 'Evil <script>alert("x")</script> T-Shirt & <b>Bold</b>'


def small_shop(num_products: int = SMALL, with_hostile: bool = False) -> Shop:
    products = generate_products(num_products, seed=0)
    goals = generate_goals(products, seed=0)
    if with_hostile:
        evil = Product(
            asin="B0EVIL0001", name=HOSTILE_NAME, category="apparel", product_category="Clothing › Men",
            query="evil shirt", product_type="t-shirt", price=9.99, features=("<img src=x onerror=alert(1)>",),
            description="<iframe src='javascript:alert(1)'></iframe>", attributes=("cotton",),
            options={"color": ("<i>red</i>", "blue")},
        )
        products = [*products, evil]
        goals["test"].append(Goal("test-evil", evil.asin, "buy the <script> shirt, and price lower than 20.00 dollars",
                                  "apparel", evil.name, evil.query, evil.product_category, ("cotton",),
                                  {"color": "blue"}, 20.0))
    return Shop(products, goals)
