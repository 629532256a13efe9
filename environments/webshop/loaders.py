"""Loaders for the real WebShop files, for users who have them (they cannot be downloaded here).

- `items_shuffle*.json`: a list of products {asin, name, full_description, small_description (a list or one
  string), pricing ("$12.99" or "$10.00 - $20.00"), customization_options {group: [{value, image}]} or null,
  category, query, product_category ("A › B › C"), optional average_rating};
- `items_ins_v2*.json`: {asin: {attributes, instruction?, instruction_attributes?}}; optional
  `items_human_ins*.json`: {asin: [{instruction, instruction_attributes, instruction_options}]}.
Read as the original reads them: an asin "nan" or over 10 characters is skipped, a repeated one keeps its first
record, a product without a price costs $100, option values are stripped, lower-cased and "/" becomes " | ". Goals
come in catalogue order (human ones without attributes skipped; without the human file, one synthetic goal per
product), with the original's price cap (`original_price_cap`) and split: seed-233 shuffle, first 500 `test`.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.webshop.generator import SPLITS
from agentgym_opsd.environments.webshop.models import CATEGORY_SEPARATOR, Goal, Product

__all__ = ["load_real_products", "load_real_goals", "load_real_shop_data", "parse_price", "parse_pricing",
           "original_price_cap", "RealDataError", "REQUIRED_FILES", "OPTIONAL_FILES", "missing_real_files",
           "SPLIT_SEED", "TEST_GOALS"]

REQUIRED_FILES = ("items_shuffle*.json", "items_ins_v2*.json")
"""The file patterns a real-data folder must hold (products; their attributes and synthetic goals)."""
OPTIONAL_FILES = ("items_human_ins*.json",)

_PRICE = re.compile(r"\$?\s*([0-9][0-9,]*\.?[0-9]*)")

MISSING_PRICE = 100.0
"""What the original charges for a product whose pricing is empty."""
SPLIT_SEED = 233
TEST_GOALS = 500
"""The original's split: goals shuffled with seed 233, the first 500 are the test goals."""
NO_CAP = 1_000_000.0
"""The original's price_upper when no cap applies (and the instruction then names no price)."""


class RealDataError(ValueError):
    """A real WebShop file that is missing or not in the expected format."""


def parse_price(pricing: Any) -> float | None:
    """The first dollar amount of a pricing string ("$10.00 - $20.00" -> 10.0); None when absent."""
    if isinstance(pricing, (int, float)):
        return float(pricing)
    if not isinstance(pricing, str):
        return None
    match = _PRICE.search(pricing)
    return float(match.group(1).replace(",", "")) if match else None


def parse_pricing(pricing: Any) -> list[float]:
    """All dollar amounts of a pricing string, at most two ("$10.00 - $20.00" -> [10.0, 20.0]); the
    original's [100.0] when it is empty or missing."""
    if isinstance(pricing, (int, float)) and not isinstance(pricing, bool):
        return [float(pricing)]
    if not isinstance(pricing, str) or not pricing.strip():
        return [MISSING_PRICE]
    amounts = [float(m.group(1).replace(",", "")) for m in _PRICE.finditer(pricing)]
    return amounts[:2] or [MISSING_PRICE]


def original_price_cap(price: float, rng: random.Random) -> tuple[float, str]:
    """The original's price cap of a goal and its instruction text: of the first four of 10, 20, ..., 990
    above the price pick two and keep the larger; with fewer than two above, no cap (1,000,000, no text)."""
    above = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
    if len(above) < 2:
        return NO_CAP, ""
    cap = max(rng.sample(above, 2))
    return cap, f", and price lower than {cap:.2f} dollars"


def _bullet_points(value: Any) -> tuple[str, ...]:
    if isinstance(value, list):
        return tuple(str(s) for s in value if s)
    return (str(value),) if value else ()  # one string is one bullet point, as in the original


def _option_value(value: Any) -> str:
    return str(value).strip().replace("/", " | ").lower()


def _find(folder: Path, pattern: str, required: bool = True) -> Path | None:
    found = sorted(folder.glob(pattern))
    if not found and required:
        raise RealDataError(f"{folder}: no file matching {pattern!r}")
    return found[0] if found else None


def missing_real_files(folder: Path) -> list[str]:
    """The REQUIRED_FILES patterns that match nothing in `folder` (all of them when it is no folder)."""
    if not folder.is_dir():
        return list(REQUIRED_FILES)
    return [pattern for pattern in REQUIRED_FILES if not any(folder.glob(pattern))]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RealDataError(f"{path}: cannot read JSON ({exc})") from exc


def load_real_products(items_path: Path, attributes: dict[str, Any] | None = None) -> list[Product]:
    return _read_products(items_path, attributes)[0]


def _read_products(items_path: Path, attributes: dict[str, Any] | None = None
                   ) -> tuple[list[Product], dict[str, list[float]]]:
    """The products and each one's price range (the Product keeps the low end, goals draw inside it)."""
    raw = _read_json(items_path)
    if not isinstance(raw, list):
        raise RealDataError(f"{items_path}: expected a JSON list of products")
    attributes = attributes or {}
    products, seen, pricing = [], set(), {}
    for item in raw:
        asin = item.get("asin") if isinstance(item, dict) else None
        if not asin or asin == "nan" or len(str(asin)) > 10 or asin in seen:
            continue  # the original's filters: a bad asin is skipped, a repeated one keeps its first record
        seen.add(asin)
        pricing[str(asin)] = parse_pricing(item.get("pricing"))
        options = {}
        for group, values in (item.get("customization_options") or {}).items():
            names = tuple(_option_value(v.get("value", "")) for v in values or [] if isinstance(v, dict))
            if names := tuple(n for n in names if n):
                options[str(group).lower()] = names
        category_path = str(item.get("product_category") or "")
        levels = [lvl.strip() for lvl in category_path.split("›") if lvl.strip()]
        rating = item.get("average_rating")
        products.append(Product(
            asin=str(asin),
            name=str(item.get("name") or ""),
            category=str(item.get("category") or "unknown"),
            product_category=CATEGORY_SEPARATOR.join(levels),
            query=str(item.get("query") or "").lower().strip(),
            product_type=levels[-1].lower() if levels else "",
            price=pricing[str(asin)][0],
            features=_bullet_points(item.get("small_description")),
            description=str(item.get("full_description") or ""),
            attributes=tuple(str(a) for a in (attributes.get(asin) or {}).get("attributes", [])),
            options=options,
            rating=float(rating) if isinstance(rating, (int, float)) else None,
            price_range=tuple(pricing[str(asin)]),
        ))
    return products, pricing


def _goal_options(product: Product, wanted: list[str]) -> dict[str, str]:
    options = {}
    for i, value in enumerate(wanted):
        group = next((g for g, vals in product.options.items() if value.lower() in (v.lower() for v in vals)),
                     f"option_{i}")
        options[group if group not in options else f"{group}_{i}"] = value
    return options


def load_real_goals(products: list[Product], ins_v2: dict[str, Any], human: dict[str, Any] | None,
                    seed: int = 0, pricing: dict[str, list[float]] | None = None) -> dict[str, list[Goal]]:
    """Goals in the original's order and split (module docstring). `pricing` maps an asin to its price
    range; a goal's price is drawn uniformly in the range, as the original does, before its cap is drawn."""
    rng = random.Random(seed)
    pricing = pricing or {}
    raw: list[tuple[Product, str, list[str], list[str]]] = []
    for product in products:  # catalogue order, then each product's instructions in file order
        if human:
            for entry in human.get(product.asin) or []:
                attrs = entry.get("instruction_attributes") or [] if isinstance(entry, dict) else []
                if attrs:  # the original skips instructions without attributes
                    raw.append((product, str(entry.get("instruction", "")), list(attrs),
                                list(entry.get("instruction_options") or [])))
        else:
            entry = ins_v2.get(product.asin)
            if isinstance(entry, dict) and entry.get("instruction"):
                raw.append((product, entry["instruction"], entry.get("instruction_attributes") or [], []))
    goals = []
    for product, text, attrs, opts in raw:
        low_high = pricing.get(product.asin, [product.price])
        price = rng.uniform(*low_high[:2]) if len(low_high) > 1 else low_high[0]
        cap, price_text = original_price_cap(price, rng)
        goals.append((product, text.strip(".") + price_text, attrs, opts, cap))
    order = list(range(len(goals)))
    random.Random(SPLIT_SEED).shuffle(order)  # the same permutation as the original's shuffle of its goal list
    splits: dict[str, list[Goal]] = {name: [] for name in SPLITS}
    for rank, i in enumerate(order):
        product, text, attrs, opts, cap = goals[i]
        split = "test" if rank < TEST_GOALS else "train"
        splits[split].append(Goal(
            goal_id=f"{split}-{len(splits[split])}", asin=product.asin, instruction=text, category=product.category,
            name=product.name, query=product.query, product_category=product.product_category,
            attributes=tuple(attrs), options=_goal_options(product, list(opts)), price_upper=cap))
    return splits


def load_real_shop_data(folder: Path, seed: int = 0) -> tuple[list[Product], dict[str, list[Goal]]]:
    """Products and goals from a folder holding the real files."""
    ins_path = _find(folder, "items_ins_v2*.json")
    ins_v2 = _read_json(ins_path) if ins_path else {}
    if not isinstance(ins_v2, dict):
        raise RealDataError(f"{ins_path}: expected a JSON object {{asin: {{attributes, ...}}}}")
    items_path = _find(folder, "items_shuffle*.json")
    products, pricing = _read_products(items_path, ins_v2)  # type: ignore[arg-type]
    if not products:
        raise RealDataError(f"{items_path}: no product with a usable asin")
    human_path = _find(folder, "items_human_ins*.json", required=False)
    human = _read_json(human_path) if human_path else None
    if human is not None and not isinstance(human, dict):
        raise RealDataError(f"{human_path}: expected a JSON object {{asin: [instruction, ...]}}")
    goals = load_real_goals(products, ins_v2, human, seed, pricing)
    if not any(goals.values()):
        raise RealDataError(f"{folder}: no instruction names a known product, so there are no goals")
    return products, goals
