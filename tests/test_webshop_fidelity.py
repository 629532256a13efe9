"""WebShop against the original benchmark: each difference found side by side, with hand-computed values.

The reward's numbers follow the original's rule (thefuzz 0.19's token-set ratio on preprocessed text,
rounded to an integer; colour normalisation by substring in alphabetical order; per-field attribute
fallback; type reward over the nouns of both titles). Pages and actions follow the original's text
environment (search anywhere, its action split, "Next >" on every results page, its price text).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from rapidfuzz import fuzz, utils

from agentgym_opsd.environments.webshop import reward as reward_module
from agentgym_opsd.environments.webshop.env import WebShopEnv
from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.pages import price_text, rating_text
from agentgym_opsd.environments.webshop.reward import (
    NOUNS_ENV,
    SPACY_MODEL_ENV,
    attribute_matches,
    get_reward,
    normalize_color,
    option_matches,
    resolve_noun_backend,
    score_purchase,
    title_nouns,
    token_set_ratio,
    type_factor,
)
from agentgym_opsd.environments.webshop.search import index_text
from agentgym_opsd.environments.webshop.session import ShopSession, parse_action
from agentgym_opsd.environments.webshop.shop import Shop
from agentgym_opsd.parsers import WebShopParser


@pytest.fixture(autouse=True)
def heuristic_nouns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hand-computed with the noun heuristic; tests of the spaCy path install their own tagger."""
    monkeypatch.setenv(NOUNS_ENV, "heuristic")


TEE = Product(
    asin="B0FIDEL001", name="Northwind Classic T-Shirt", category="apparel",
    product_category="Clothing › Men › Shirts", query="t-shirts", product_type="t-shirt", price=19.99,
    features=("Soft cotton blend", "Machine wash"), description="A tee for every day.",
    attributes=("cotton", "short sleeve"), options={"color": ("royal blue", "black"), "size": ("large", "x-large")},
)
GOAL = Goal(goal_id="f-0", asin=TEE.asin, instruction="i need a navy blue t-shirt", category="apparel",
            name=TEE.name, query=TEE.query, product_category=TEE.product_category,
            attributes=("short sleeves", "machine wash", "waterproof"),
            options={"color": "navy blue", "size": "x-large"}, price_upper=30.0)


# ---- fuzzy matching --------------------------------------------------------------------------------------
def test_fuzzy_preprocessing_lowercases_and_splits_punctuation() -> None:
    # "x-large" -> {x, large} holds {large}: the intersection alone is one of the compared strings -> 100.
    assert token_set_ratio("x-large", "large") == 100
    assert token_set_ratio("6.5", "6") == 100  # {6, 5} holds {6}
    assert token_set_ratio("small | medium", "Small/Medium") == 100  # both {small, medium}
    # {short, sleeve} vs {short, sleeves}: "short sleeve" vs "short sleeves" = 2*12/25 = 0.96 -> 96
    assert token_set_ratio("short sleeve", "short sleeves") == 96
    assert token_set_ratio("", "large") == 0 and token_set_ratio("!!", "large") == 0


def test_fuzzy_ratio_is_rounded_to_an_integer_before_the_threshold() -> None:
    a = "abcdefghijklmnopqrstuvw"  # 23 characters, a prefix of b (31): 2*23/54 = 0.8519 -> 85, not > 85
    b = a + "12345678"
    assert token_set_ratio(a, b) == 85
    assert fuzz.token_set_ratio(a, b, processor=utils.default_process) > 85  # unrounded it would match
    product = dataclasses.replace(TEE, attributes=(b,))
    assert attribute_matches([a], product) == 0


# ---- colours ---------------------------------------------------------------------------------------------
def test_colour_normalisation_is_substring_in_alphabetical_order() -> None:
    assert normalize_color("navy blue") == "blue" and normalize_color("royal blue") == "blue"
    assert normalize_color("light pink") == "light"  # "light" < "pink"
    assert normalize_color("stonewashed") == "ash"  # stonew-ash-ed: "ash" < "stone" < "stonewash"
    assert normalize_color("standard") == "tan"  # inside a word too
    assert normalize_color("Dark Brown") == "Dark Brown"  # case-sensitive: no lower-case colour inside
    assert option_matches(["navy blue"], ["royal blue"]) == 1  # both "blue"
    assert option_matches(["large"], ["x-large"]) == 1


def test_navy_wanted_royal_bought_scores_like_the_original() -> None:
    goal = dataclasses.replace(GOAL, attributes=("cotton",), options={"color": "navy blue"})
    assert score_purchase(goal, TEE, ["royal blue"]).score == 1.0  # was 2/3 with whole-word colours


# ---- attributes ------------------------------------------------------------------------------------------
def test_attribute_fallback_searches_each_field_and_keeps_the_goal_case() -> None:
    bare = dataclasses.replace(TEE, attributes=())
    assert attribute_matches(["cotton blend"], bare) == 1  # in a bullet
    assert attribute_matches(["blend machine"], bare) == 1  # bullets are joined by spaces, as there
    assert attribute_matches(["t-shirt soft"], bare) == 0  # title end + first bullet: different fields
    assert attribute_matches(["every day"], bare) == 1  # description
    assert attribute_matches(["Cotton Blend"], bare) == 0  # the goal attribute is not lower-cased
    assert attribute_matches(["Cotton"], TEE) == 1  # ... but the fuzzy step is case-blind


# ---- product type ----------------------------------------------------------------------------------------
def test_type_reward_counts_duplicate_goal_nouns() -> None:
    goal = dataclasses.replace(GOAL, name="Kestrel Boots Kestrel", query="boots", product_category="Shoes")
    bought = dataclasses.replace(TEE, name="Kestrel Jacket", query="jackets")
    # goal nouns [kestrel, boots, kestrel]; shared {kestrel}: 1/3 (a set would give 1/2)
    r_type, title_score = type_factor(goal, bought)
    assert title_score == pytest.approx(1 / 3) and r_type == 1.0  # 1/3 > 0.2


class _FakeTagger:
    """A stand-in spaCy pipeline: each title's tokens with the POS tags given here."""

    def __init__(self, tags: dict[str, list[tuple[str, str]]]) -> None:
        self.tags = tags

    def __call__(self, title: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(text=text, pos_=pos) for text, pos in self.tags[title]]


def test_type_reward_uses_only_nouns_of_the_bought_title(monkeypatch: pytest.MonkeyPatch) -> None:
    tagger = _FakeTagger({"Shoe Polish": [("Shoe", "NOUN"), ("Polish", "NOUN")],
                          "Polish Shoe Rack": [("Polish", "ADJ"), ("Shoe", "NOUN"), ("Rack", "NOUN")]})
    monkeypatch.setattr(reward_module, "_spacy_pipeline", lambda model: tagger)
    reward_module._spacy_nouns.cache_clear()
    goal = dataclasses.replace(GOAL, name="Shoe Polish")
    bought = dataclasses.replace(TEE, name="Polish Shoe Rack")
    # goal nouns [shoe, polish]; bought nouns {shoe, rack}: 1/2 ("polish" is there, but not as a noun)
    assert type_factor(goal, bought, nouns="spacy") == (1.0, 0.5)
    assert title_nouns("Polish Shoe Rack", "spacy") == ["shoe", "rack"]
    reward_module._spacy_nouns.cache_clear()


def test_type_reward_query_and_category_as_written() -> None:
    goal = dataclasses.replace(GOAL, name="Kestrel Boots Jacket Hat Scarf", query="", product_category="A › B")
    low = dataclasses.replace(TEE, name="Kestrel", query="", product_category="a › b")
    # title 1/5 = 0.2 is not > 0.2; empty queries are equal (a match); levels are case-sensitive
    assert type_factor(goal, low) == (1.0, 0.2)
    other_query = dataclasses.replace(low, query="x")
    assert type_factor(goal, other_query) == (0.5, 0.2)  # "A","B" vs "a","b": no shared level


def test_noun_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_noun_backend("heuristic") == "heuristic"
    with pytest.raises(ValueError):
        resolve_noun_backend("tagger")
    monkeypatch.setenv(SPACY_MODEL_ENV, "no_such_spacy_model_for_tests")
    assert resolve_noun_backend("auto") == "heuristic"  # falls back when the model is missing
    with pytest.raises(RuntimeError, match="spaCy"):
        resolve_noun_backend("spacy")


# ---- the drop-in API -------------------------------------------------------------------------------------
PRODUCT_DICT = {"Title": TEE.name, "BulletPoints": list(TEE.features), "Description": TEE.description,
                "Attributes": list(TEE.attributes), "query": TEE.query, "product_category": TEE.product_category,
                "name": TEE.name}
GOAL_DICT = {"attributes": ["short sleeves", "machine wash", "waterproof"], "goal_options": ["navy blue", "x-large"],
             "price_upper": 30.0, "query": TEE.query, "product_category": TEE.product_category, "name": TEE.name}


def test_get_reward_on_the_original_dictionaries() -> None:
    # attributes: "short sleeves" ~ "short sleeve" (96), "machine wash" in the bullets, "waterproof" no -> 2
    # options: navy blue ~ royal blue (both "blue"), x-large ~ large (100) -> 2; price 19.99 <= 30 -> 1
    # type: same title and query -> 1.   (2 + 2 + 1) / (3 + 2 + 1) = 5/6
    score = get_reward(PRODUCT_DICT, GOAL_DICT, 19.99, {"color": "royal blue", "size": "large"})
    assert score == pytest.approx(5 / 6)
    assert score == pytest.approx(score_purchase(GOAL, TEE, ["royal blue", "large"]).score)
    verbose = get_reward(PRODUCT_DICT, GOAL_DICT, 45.0, {"color": "black"}, verbose=True)
    assert isinstance(verbose, tuple)
    total, info = verbose
    # black vs {blue, x-large}: no option; price 45 > 30 -> (2 + 0 + 0) / 6
    assert total == pytest.approx(2 / 6) and info["r_price"] is False and info["r_option"] == 0.0


def test_get_reward_with_dict_goal_options_scores_the_pairs_as_the_original() -> None:
    # A dict goal hands ("size", "large") to the scorer as its text: {size, large} vs {x, large} -> 83, no match.
    goal = dict(GOAL_DICT, attributes=["cotton"], goal_options={"size": "large"})
    assert get_reward(PRODUCT_DICT, goal, 19.99, {"size": "x-large"}) == pytest.approx(2 / 3)
    as_list = dict(goal, goal_options=["large"])
    assert get_reward(PRODUCT_DICT, as_list, 19.99, {"size": "x-large"}) == pytest.approx(1.0)


# ---- pages and actions -----------------------------------------------------------------------------------
def _shop() -> Shop:
    products = [TEE, dataclasses.replace(TEE, asin="B0FIDEL002", name="Kestrel Rain Jacket", features=("Hood",),
                                         description="Keeps you dry.", attributes=("zzhidden",),
                                         options={"size": ("m",)})]
    return Shop(products, {"test": [GOAL]})


def test_search_works_on_every_page() -> None:
    session = ShopSession(_shop(), GOAL)
    assert session.act("search[t-shirt]").valid and session.kind == "results"
    assert session.act("click[b0fidel001]").valid and session.kind == "item"
    assert session.act("click[description]").valid and session.kind == "detail"
    assert session.act("search[rain jacket]").valid  # from a detail page, no search bar shown
    assert session.kind == "results" and session.page_num == 1 and session.num_searches == 2
    assert session.admissible_actions()[-1] != "search[<your query>]"  # the hint follows the search bar


def test_next_is_shown_on_the_last_results_page() -> None:
    session = ShopSession(_shop(), GOAL)
    session.act("search[t-shirt]")
    page = session.page()
    assert "next >" in page.clickables and "< prev" not in page.clickables
    assert session.act("click[next >]").valid
    obs = session.page().observation()
    assert "Page 2 (Total results: 1)" in obs and "B0FIDEL001" not in obs and obs.endswith("< Prev [SEP] Next >")
    assert not session.view().has_next  # the expert's view still means "more results exist"


def test_prices_and_ratings_as_the_original_prints_them() -> None:
    assert price_text((24.49, 39.99)) == "$24.49 to $39.99"
    assert price_text((100.0,)) == "$100.0" and price_text((19.9,)) == "$19.9"
    assert rating_text(None) == "N.A." and rating_text(4.0) == "4.0"
    session = ShopSession(_shop(), GOAL)
    session.act("search[t-shirt]")
    assert "$19.99" in session.page().observation()
    session.act("click[b0fidel001]")
    assert "Price: $19.99 [SEP] Rating: N.A." in session.page().observation()


def test_index_has_the_original_fields_only() -> None:
    shop = _shop()
    text = index_text(shop.products[1])
    assert text == "kestrel rain jacket keeps you dry. hood size: m"
    assert index_text(TEE).endswith("soft cotton blend color: royal blue, black, and size: large, x-large")
    assert shop.search("zzhidden") == []  # reward attributes are not searchable
    assert shop.search("B0FIDEL002") == []  # nor product ids


def test_action_split_runs_to_the_last_bracket() -> None:
    assert parse_action("search[red shirt] now") == ("search", "red shirt")
    assert parse_action("search[shirt [large]] please") == ("search[shirt ", "large]")  # not a search
    assert parse_action("search[a] b]") == ("search", "a] b")
    assert parse_action("search[a]\nclick[b]") == ("search", "a")  # first line only
    assert parse_action("search[a\nb]") is None
    assert parse_action("search[]") is None and parse_action("[x]") is None
    session = ShopSession(_shop(), GOAL)
    assert not session.act("Search[t-shirt]").valid and session.kind == "search"  # verb as written
    assert session.act("think[I should look for a tee]").valid and session.kind == "search"
    assert not session.act("look[around]").valid


def test_parser_takes_the_argument_to_the_last_bracket() -> None:
    parser = WebShopParser()
    assert parser.parse("search[shirt [xl]] now").action == "search[shirt [xl]]"
    assert parser.parse("<action>think[compare prices]</action>").action == "think[compare prices]"
    assert parser.parse("click[Next >]\nsearch[x]").action == "click[next >]"
    assert not parser.parse("search[no closing\nbracket]").valid


def test_env_think_is_a_valid_no_op() -> None:
    env = WebShopEnv(split="test", num_products=60)
    obs0, _ = env.reset(options={"task_index": 0})
    obs, reward, terminated, _, info = env.step("think[what colour do they want?]")
    assert obs == obs0 and reward == 0 and not terminated and info["action_valid"]
