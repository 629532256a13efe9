"""WebShop-v0 in text mode: registration, the oracle, invalid actions, determinism, loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_webshop_helpers import SMALL, small_shop

from agentgym_opsd.core import INFO_KEYS, PRIVILEGED_HINTS, EpisodeEndedError
from agentgym_opsd.environments.webshop.env import WebShopEnv
from agentgym_opsd.environments.webshop.loaders import load_real_shop_data, parse_price
from agentgym_opsd.environments.webshop.session import ShopSession
from agentgym_opsd.environments.webshop.shop import Shop
from agentgym_opsd.registry import env_profile, load_skill_library, make

ENV_KW = {"num_products": SMALL}


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    return WebShopEnv(split="test", **ENV_KW)


def play_oracle(env: WebShopEnv, index: int) -> tuple[float, bool, int]:
    env.reset(options={"task_index": index})
    for turn in range(env.max_turns):
        obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        assert info["action_valid"], obs
        if terminated or truncated:
            return reward, info["won"], turn + 1
    raise AssertionError("oracle did not finish")


def test_registered_profile_and_skills() -> None:
    profile = env_profile("WebShop-v0")
    assert (profile.parser, profile.max_turns, profile.history_turns) == ("webshop", 15, 2)
    assert profile.skill_library == "webshop" and profile.invalid_action_penalty == 0.1
    library = load_skill_library("webshop")
    for category in ("apparel", "footwear", "home", "electronics", "beauty", "grocery", "sports", "furniture"):
        assert category in library.task_types
    env = make("WebShop-v0:test", **ENV_KW)
    obs, info = env.reset(seed=0)
    assert set(INFO_KEYS) <= set(info) and info["task_type"] in library.task_types
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert "Instruction:" in obs and info["task_text"] in obs
    hints = info.pop(PRIVILEGED_HINTS)  # the one structured optional key: hint level -> text, teacher only
    assert set(hints) == {"goal"} and all(isinstance(v, str) and v for v in hints.values())
    assert all(isinstance(v, (str, int, float, bool)) for k, v in info.items() if k not in INFO_KEYS)


def test_oracle_buys_the_target_with_score_1(env: WebShopEnv) -> None:
    for index in range(env.num_tasks):
        reward, won, turns = play_oracle(env, index)
        assert reward == 1.0 and won and turns <= 8
    with pytest.raises(EpisodeEndedError):
        env.oracle_action()


def test_the_expert_opens_the_satisfying_result_the_titles_favour(env: WebShopEnv) -> None:
    """With the catalogue the expert may open another product than the hidden target, but only one that
    satisfies the goal, and among those the one whose title shows the most goal attributes; without it the
    target (the older expert)."""
    from agentgym_opsd.environments.webshop.oracle import _title_evidence, expert_pick, satisfies

    others = 0
    for index in range(env.num_tasks):
        env.reset(options={"task_index": index})
        env.step(env.oracle_action())  # search the instruction
        goal, session = env.goals[index], env.unwrapped._backend.session
        target, view = env.shop.by_asin[goal.asin], session.view()
        pick = expert_pick(goal, target, view.page_asins, env.shop.by_asin)
        if pick is None:
            continue
        assert env.oracle_action() == f"click[{pick.lower()}]" and satisfies(goal, env.shop.by_asin[pick])
        on_page = [env.shop.by_asin[a] for a in view.page_asins]
        best = max(_title_evidence(goal, p) for p in on_page if satisfies(goal, p))
        assert _title_evidence(goal, env.shop.by_asin[pick]) == best
        assert expert_pick(goal, target, view.page_asins, None) == (goal.asin if goal.asin in view.page_asins else None)
        others += pick != goal.asin
    assert others > 0  # the case the change is for occurs in this shop


def test_wrong_purchase_scores_below_one(env: WebShopEnv) -> None:
    obs, info = env.reset(options={"task_index": 1})
    env.step(env.oracle_action())  # search
    env.step(env.oracle_action())  # open the target
    obs, reward, terminated, _, info = env.step("click[buy now]")  # no options chosen
    goal = env.goals[1]
    assert terminated and not info["won"]
    assert reward == pytest.approx(info["score"]) and 0 < reward < 1
    expected = (len(goal.attributes) + 1) / (len(goal.attributes) + len(goal.options) + 1)
    assert reward == pytest.approx(expected, abs=1e-6) if goal.options else reward == 1.0


def test_invalid_actions_change_nothing(env: WebShopEnv) -> None:
    obs0, _ = env.reset(options={"task_index": 0})
    for bad in ["", "buy it", "click[]", "click[not on page]", "click[buy now]", "search[" + "x" * 5000 + "]",
                "search[a" * 3, "CLICK[[[", "Search[x]", "click[ buy now]", "look[around]"]:
        obs, reward, terminated, truncated, info = env.step(bad)  # type: ignore[arg-type]
        assert obs == obs0 and reward == 0 and not terminated and not info["action_valid"]
        assert info["invalid_reason"]
    env.reset(options={"task_index": 0})
    obs, *_ , info = env.step("search[black white grey navy]")
    assert info["action_valid"] and obs.count("[SEP]") > 5
    obs2, *_, info = env.step("think[page 2 next]")  # a thought: valid, nothing changes
    assert obs2 == obs and info["action_valid"]
    obs3, *_, info = env.step("click[NEXT >]")  # the argument is lower-cased, as in the original
    assert info["action_valid"] and "Page 2" in obs3
    obs4, *_, info = env.step("search[other]")  # search works on every page, as in the original
    assert info["action_valid"] and "Page 1" in obs4


def test_turn_limit_truncates() -> None:
    env = WebShopEnv(split="train", max_turns=3, **ENV_KW)
    env.reset(seed=1)
    results = [env.step("click[nothing]") for _ in range(3)]
    assert results[-1][3] and not results[-1][2]


def test_same_seed_same_episode() -> None:
    a, b = WebShopEnv(**ENV_KW), WebShopEnv(**ENV_KW)
    assert a.reset(seed=5) == b.reset(seed=5)
    for action in ["search[red cotton]", "click[next >]", "click[< prev]"]:
        assert a.step(action) == b.step(action)


def test_options_task_id(env: WebShopEnv) -> None:
    _, info = env.reset(options={"task_id": "test-3"})
    assert info["task_id"] == "test-3" and info["task_index"] == 3
    with pytest.raises(ValueError):
        env.reset(options={"task_id": "nope"})


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=300))
def test_fuzzed_actions_never_crash(text: str) -> None:
    session = ShopSession(SHOP, SHOP.goals["test"][0])
    for action in (text, f"search[{text}]", f"click[{text}]"):
        result = session.act(action)
        assert isinstance(result.valid, bool)
        session.page().observation()


SHOP = small_shop(60)


def test_real_data_loader(tmp_path: Path) -> None:
    items = [
        {"asin": "B0REAL0001", "name": "Acme Red Cotton T-Shirt", "full_description": "Soft tee.",
         "small_description": ["100% cotton", "machine wash"], "pricing": "$12.50 - $15.00",
         "customization_options": {"Color": [{"value": "Red", "image": None}, {"value": "Blue", "image": None}],
                                   "Size": [{"value": "Large", "image": None}]},
         "category": "fashion", "query": "t-shirt", "product_category": "Clothing › Men › T-Shirts"},
        {"asin": "B0REAL0002", "name": "No price", "pricing": ""},
    ]
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(items))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps({"B0REAL0001": {"attributes": ["cotton"]}}))
    (tmp_path / "items_human_ins.json").write_text(json.dumps({"B0REAL0001": [
        {"instruction": "i want a red cotton t-shirt", "instruction_attributes": ["cotton"],
         "instruction_options": ["red", "large"]}]}))
    products, goals = load_real_shop_data(tmp_path)
    assert [p.asin for p in products] == ["B0REAL0001", "B0REAL0002"] and products[0].price == 12.5
    assert products[1].price == 100.0  # the original's price for a product without one
    assert products[0].options == {"color": ("red", "blue"), "size": ("large",)}
    goal = goals["test"][0]
    assert goal.options == {"color": "red", "size": "large"} and goal.price_upper > 12.5
    shop = Shop(products, goals)
    session = ShopSession(shop, goal)
    for action in ["search[red cotton t-shirt]", "click[b0real0001]", "click[red]", "click[large]", "click[buy now]"]:
        assert session.act(action).valid
    assert session.score == 1.0
    assert parse_price("$1,299.00") == 1299.0 and parse_price(None) is None
