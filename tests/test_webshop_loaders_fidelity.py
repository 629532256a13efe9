"""The real-data loaders read the original WebShop files as the original does (hand-computed cases)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentgym_opsd.environments.webshop.loaders import (
    NO_CAP,
    SPLIT_SEED,
    TEST_GOALS,
    load_real_shop_data,
    original_price_cap,
    parse_pricing,
)


def _write(folder: Path, items: list[dict], human: dict | None = None, ins: dict | None = None) -> None:
    (folder / "items_shuffle.json").write_text(json.dumps(items))
    (folder / "items_ins_v2.json").write_text(json.dumps(ins or {}))
    if human is not None:
        (folder / "items_human_ins.json").write_text(json.dumps(human))


def _item(asin: str, **extra) -> dict:
    return {"asin": asin, "name": f"Thing {asin}", "pricing": "$5.00", "category": "beauty", "query": "Thing ",
            "product_category": "A › B › C", "full_description": "", "small_description": [], **extra}


def test_pricing_as_the_original_parses_it():
    assert parse_pricing("$24.49 - $39.99") == [24.49, 39.99]
    assert parse_pricing("$1,299.00") == [1299.0]
    assert parse_pricing("") == parse_pricing(None) == [100.0]


@pytest.mark.parametrize("price, caps", [(5.0, {20.0, 30.0, 40.0}), (975.0, {990.0}), (985.0, {NO_CAP}),
                                         (965.0, {980.0, 990.0})])
def test_price_cap_rule(price, caps):
    # first four of 10, 20, ..., 990 above the price, two drawn, the larger kept; fewer than two: no cap
    seen = {original_price_cap(price, random.Random(s))[0] for s in range(60)}
    assert seen == caps
    cap, text = original_price_cap(price, random.Random(0))
    assert text == ("" if cap == NO_CAP else f", and price lower than {cap:.2f} dollars")


def test_products_read_as_the_original_reads_them(tmp_path):
    _write(tmp_path, [
        _item("B0A", small_description="One long string, with commas.", pricing="",
              customization_options={"Size": [{"value": " Small/Medium "}, {"value": "X-Large"}]}),
        _item("nan"), _item("B0TOOLONGASIN"), _item("B0A", name="duplicate"),
    ], human={"B0A": [{"instruction": "i need a thing.", "instruction_attributes": ["x"], "instruction_options": []}]})
    products, _ = load_real_shop_data(tmp_path)
    (p,) = products
    assert p.name == "Thing B0A" and p.price == 100.0 and p.query == "thing"
    assert p.features == ("One long string, with commas.",)
    assert p.options == {"size": ("small | medium", "x-large")}


def test_human_goals_skip_empty_attributes_strip_the_dot_and_split_as_the_original(tmp_path):
    n = TEST_GOALS + 40
    items = [_item(f"B{i:04d}") for i in range(n)]
    human = {f"B{i:04d}": [{"instruction": f".goal {i}.", "instruction_attributes": ["a"],
                            "instruction_options": []},
                           {"instruction": "no attributes", "instruction_attributes": [], "instruction_options": []}]
             for i in range(n)}
    _write(tmp_path, items, human=human)
    _, goals = load_real_shop_data(tmp_path)
    assert len(goals["test"]) == TEST_GOALS and len(goals["train"]) == n - TEST_GOALS
    order = list(range(n))  # goals in catalogue order, shuffled with the original's seed
    random.Random(SPLIT_SEED).shuffle(order)
    assert [g.asin for g in goals["test"]] == [f"B{i:04d}" for i in order[:TEST_GOALS]]
    first = goals["test"][0]
    assert first.instruction.startswith(f"goal {order[0]}, and price lower than ")  # both dots stripped
    assert first.price_upper in {20.0, 30.0, 40.0}


def test_a_price_range_is_listed_as_the_original_prints_it(tmp_path):
    from agentgym_opsd.environments.webshop.pages import price_text

    _write(tmp_path, [_item("B0R", pricing="$24.49 - $39.99"), _item("B0S", pricing="$100")],
           human={"B0R": [{"instruction": "x", "instruction_attributes": ["a"], "instruction_options": []}]})
    products, _ = load_real_shop_data(tmp_path)
    assert [price_text(p.listed_prices) for p in products] == ["$24.49 to $39.99", "$100.0"]
    assert products[0].price == 24.49
