"""Loaders for the real WebShop files, for users who have them (they cannot be downloaded here).

- `items_shuffle*.json`: a list of products {asin, name, full_description, small_description (list),
  pricing ("$12.99" or "$10.00 - $20.00"), customization_options {group: [{value, image}]} or null,
  category, query, product_category ("A › B › C"), optional average_rating}.
- `items_ins_v2*.json`: {asin: {attributes: [...], instruction?, instruction_attributes?}}.
- `items_human_ins.json` (optional): {asin: [{instruction, instruction_attributes, instruction_options}]}.

Goals come from the human instructions when that file exists, else from `items_ins_v2`'s synthetic
instructions; the price cap follows the original rule (generator.price_cap). Split: every TEST_EVERY-th goal
is test (the original's own split indices are not part of the files).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.webshop.generator import SPLITS, TEST_EVERY, price_cap
from agentgym_opsd.environments.webshop.models import CATEGORY_SEPARATOR, Goal, Product

__all__ = ["load_real_products", "load_real_goals", "load_real_shop_data", "parse_price", "RealDataError",
           "REQUIRED_FILES", "OPTIONAL_FILES", "missing_real_files"]

REQUIRED_FILES = ("items_shuffle*.json", "items_ins_v2*.json")
"""The file patterns a real-data folder must hold (products; their attributes and synthetic goals)."""
OPTIONAL_FILES = ("items_human_ins*.json",)

_PRICE = re.compile(r"\$?\s*([0-9][0-9,]*\.?[0-9]*)")


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
    raw = _read_json(items_path)
    if not isinstance(raw, list):
        raise RealDataError(f"{items_path}: expected a JSON list of products")
    attributes = attributes or {}
    products, seen = [], set()
    for item in raw:
        if not isinstance(item, dict) or not item.get("asin") or item["asin"] in seen:
            continue
        price = parse_price(item.get("pricing"))
        if price is None:
            continue  # the original also drops products without a price
        seen.add(item["asin"])
        options = {}
        for group, values in (item.get("customization_options") or {}).items():
            names = tuple(str(v.get("value", "")).strip() for v in values or [] if isinstance(v, dict))
            if names := tuple(n for n in names if n):
                options[str(group).lower()] = names
        category_path = str(item.get("product_category") or "")
        levels = [lvl.strip() for lvl in category_path.split("›") if lvl.strip()]
        rating = item.get("average_rating")
        products.append(Product(
            asin=str(item["asin"]),
            name=str(item.get("name") or ""),
            category=str(item.get("category") or "unknown"),
            product_category=CATEGORY_SEPARATOR.join(levels),
            query=str(item.get("query") or ""),
            product_type=levels[-1].lower() if levels else "",
            price=price,
            features=tuple(str(s) for s in item.get("small_description") or [] if s),
            description=str(item.get("full_description") or ""),
            attributes=tuple(str(a) for a in (attributes.get(item["asin"]) or {}).get("attributes", [])),
            options=options,
            rating=float(rating) if isinstance(rating, (int, float)) else None,
        ))
    return products


def _goal_options(product: Product, wanted: list[str]) -> dict[str, str]:
    options = {}
    for i, value in enumerate(wanted):
        group = next((g for g, vals in product.options.items() if value.lower() in (v.lower() for v in vals)),
                     f"option_{i}")
        options[group if group not in options else f"{group}_{i}"] = value
    return options


def load_real_goals(products: list[Product], ins_v2: dict[str, Any], human: dict[str, Any] | None,
                    seed: int = 0) -> dict[str, list[Goal]]:
    by_asin = {p.asin: p for p in products}
    rng = random.Random(seed)
    raw: list[tuple[Product, str, list[str], list[str]]] = []
    if human:
        for asin, entries in human.items():
            for entry in entries if asin in by_asin else []:
                raw.append((by_asin[asin], entry.get("instruction", ""), entry.get("instruction_attributes", []),
                            entry.get("instruction_options", [])))
    else:
        for asin, entry in ins_v2.items():
            if asin in by_asin and isinstance(entry, dict) and entry.get("instruction"):
                raw.append((by_asin[asin], entry["instruction"], entry.get("instruction_attributes", []), []))
    splits: dict[str, list[Goal]] = {name: [] for name in SPLITS}
    for i, (product, text, attrs, opts) in enumerate(raw):
        split = "test" if i % TEST_EVERY == 0 else "train"
        cap = price_cap(product.price, rng)
        splits[split].append(Goal(
            goal_id=f"{split}-{len(splits[split])}", asin=product.asin,
            instruction=f"{text.strip()}, and price lower than {cap:.2f} dollars", category=product.category,
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
    products = load_real_products(items_path, ins_v2)  # type: ignore[arg-type]
    if not products:
        raise RealDataError(f"{items_path}: no product with an asin and a price")
    human_path = _find(folder, "items_human_ins*.json", required=False)
    human = _read_json(human_path) if human_path else None
    if human is not None and not isinstance(human, dict):
        raise RealDataError(f"{human_path}: expected a JSON object {{asin: [instruction, ...]}}")
    goals = load_real_goals(products, ins_v2, human, seed)
    if not any(goals.values()):
        raise RealDataError(f"{folder}: no instruction names a known product, so there are no goals")
    return products, goals
