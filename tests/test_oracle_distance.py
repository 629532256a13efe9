"""`info["oracle_distance"]` in every environment: the expert's own trajectory walks it down by exactly one
per step to 0 at the win, an invalid action leaves it unchanged, a wasted valid action does not lower it;
and the rollout records it on each turn (before / after the action)."""

from __future__ import annotations

from typing import Any

import pytest
from search_qa_helpers import tiny_search_qa_kwargs
from test_webshop_helpers import SMALL

from agentgym_opsd.core import TextEnv
from agentgym_opsd.policies import PolicyOutput, PolicyRequest

KEY = "oracle_distance"


def oracle_distances(env: TextEnv, reset_info: dict[str, Any]) -> tuple[list[int | None], dict[str, Any]]:
    """The distance at reset and after each expert step, and the last step's info."""
    distances, info, done = [reset_info[KEY]], reset_info, False
    while not done:
        _, _, terminated, truncated, info = env.step(env.oracle_action())
        assert info["action_valid"]
        distances.append(info[KEY])
        done = terminated or truncated
    return distances, info


def assert_counts_down(distances: list[int | None], last: dict[str, Any]) -> None:
    start = distances[0]
    assert isinstance(start, int) and start >= 1
    assert distances == list(range(start, -1, -1)), distances
    assert last["won"]


# ---- ALFWorld ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def alfworld(fresh_cache_dir):
    pytest.importorskip("textworld")
    from agentgym_opsd.environments.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split="easy")
    yield env
    env.close()


@pytest.mark.parametrize("index", [0, 21, 42, 63, 84, 105])  # one game of each task type
def test_alfworld_oracle_counts_down(alfworld, index: int) -> None:
    _, info = alfworld.reset(options={"task_index": index})
    assert info[KEY] == info["optimal_plan_length"]
    assert_counts_down(*oracle_distances(alfworld, info))


def test_alfworld_invalid_and_wasted_actions(alfworld) -> None:
    from agentgym_opsd.environments.alfworld.planner import PLAN_CACHE

    _, info = alfworld.reset(options={"task_index": 3})
    start = info[KEY]
    _, _, _, _, info = alfworld.step("fly to the moon")
    assert not info["action_valid"] and info[KEY] == start
    expert = alfworld.oracle_action()
    wasted = next(a for a in info["admissible_actions"] if a.startswith(("look", "inventory", "examine")))
    assert wasted != expert
    _, _, _, _, info = alfworld.step(wasted)
    assert info["action_valid"] and info[KEY] >= start
    # From the state the wasted action reached, the (replanned) expert still counts down by one to the win.
    assert_counts_down(*oracle_distances(alfworld, info))
    # The G copies of a task revisit states: the second visit is a cache hit, not a new plan.
    alfworld.reset(options={"task_index": 3})
    hits = PLAN_CACHE.hits
    alfworld.step(wasted)
    assert PLAN_CACHE.hits == hits + 1


def test_alfworld_detour_raises_the_distance(alfworld) -> None:
    """Going somewhere the plan does not need costs the walk back: the distance goes up, never down."""
    _, info = alfworld.reset(options={"task_index": 3})
    start, expert = info[KEY], alfworld.oracle_action()
    detours = [a for a in info["admissible_actions"] if a.startswith("go to ") and a != expert]
    assert detours
    _, _, _, _, info = alfworld.step(detours[0])
    assert info[KEY] >= start


# ---- WebShop --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def webshop():
    from agentgym_opsd.environments.webshop.env import WebShopEnv

    return WebShopEnv(split="test", num_products=SMALL)


@pytest.mark.parametrize("index", range(6))
def test_webshop_oracle_counts_down(webshop, index: int) -> None:
    _, info = webshop.reset(options={"task_index": index})
    assert_counts_down(*oracle_distances(webshop, info))


def test_webshop_invalid_and_wasted_actions(webshop) -> None:
    _, info = webshop.reset(options={"task_index": 0})
    start = info[KEY]
    for bad in ("click[no such button]", "buy it", "search[]"):
        _, _, _, _, info = webshop.step(bad)
        assert not info["action_valid"] and info[KEY] == start
    _, _, _, _, info = webshop.step(webshop.oracle_action())  # the search: one step closer
    assert info[KEY] == start - 1
    on_results = info[KEY]
    # Opening a product that is not the target costs a step back: wasted, and the distance goes up.
    target = webshop.shop.by_asin[webshop._goal.asin].asin.lower()
    other = next(a for a in info["admissible_actions"]
                 if a.startswith("click[") and a[6:-1] not in (target, "next >", "< prev", "back to search"))
    _, _, _, _, info = webshop.step(other)
    assert info["action_valid"] and info[KEY] > on_results
    assert_counts_down(*oracle_distances(webshop, info))


def test_webshop_wrong_purchase_is_out_of_reach(webshop) -> None:
    _, info = webshop.reset(options={"task_index": 1})
    for _ in range(3):  # search, open the target, ... then buy without the wanted options
        if webshop.oracle_action() == "click[buy now]" or "click[buy now]" in info["admissible_actions"]:
            break
        _, _, _, _, info = webshop.step(webshop.oracle_action())
    _, reward, terminated, _, info = webshop.step("click[buy now]")
    assert terminated
    assert info[KEY] == (0 if info["won"] else None)


# ---- Search-QA ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def search_qa(tmp_path_factory):
    from agentgym_opsd.environments.search_qa.env import SearchQAEnv

    return SearchQAEnv(split="test", **tiny_search_qa_kwargs(tmp_path_factory.mktemp("sqa")))


def test_search_qa_oracle_counts_down(search_qa) -> None:
    kinds = set()
    for index in range(search_qa.num_tasks):
        _, info = search_qa.reset(options={"task_index": index})
        kinds.add(info["task_type"])
        distances, last = oracle_distances(search_qa, info)
        if last["won"]:
            assert_counts_down(distances, last)
    assert kinds == {"single_hop", "multi_hop", "comparison"}


def test_search_qa_starts_at_hops_plus_answer(search_qa) -> None:
    for index in range(search_qa.num_tasks):
        _, info = search_qa.reset(options={"task_index": index})
        assert info[KEY] == len(search_qa.question.hops) + 1


def test_search_qa_invalid_and_wasted_actions(search_qa) -> None:
    index = next(i for i, q in enumerate(search_qa.questions) if len(q.hops) >= 2)
    _, info = search_qa.reset(options={"task_index": index})
    start = info[KEY]
    _, _, _, _, info = search_qa.step("no tags")
    assert not info["action_valid"] and info[KEY] == start
    _, _, _, _, info = search_qa.step("<search>zzz qqq xyzzy</search>")  # retrieves nothing the chain needs
    assert info["action_valid"] and info[KEY] == start
    _, _, terminated, _, info = search_qa.step("<answer>certainly not the answer</answer>")
    assert terminated and info[KEY] is None


# ---- the rollout records it -----------------------------------------------------------------------------------
class _WasteThenExpert:
    """First an inadmissible action, then a wasted valid one ('look'), then the expert."""

    def __init__(self) -> None:
        self.turn = 0

    def act(self, requests: list[PolicyRequest]) -> list[PolicyOutput]:
        outputs = []
        for req in requests:
            assert req.oracle is not None
            action = {0: "fly to the moon", 1: "look"}.get(self.turn) or req.oracle()
            outputs.append(PolicyOutput(req.format_action(action)))
        self.turn += 1
        return outputs


def test_rollout_records_before_and_after(fresh_cache_dir) -> None:
    pytest.importorskip("textworld")
    from agentgym_opsd.envpool import TaskSpec
    from agentgym_opsd.rollout import RolloutRunner

    runner = RolloutRunner("agentgym_opsd/ALFWorld-v0:easy", num_envs=1)
    try:
        (traj,) = runner.run(_WasteThenExpert(), [TaskSpec(seed=0, options={"task_index": 3})])
    finally:
        runner.close()
    assert traj.won
    turns = [(t.info["oracle_distance_before"], t.info["oracle_distance_after"], t.action_valid) for t in traj.turns]
    start = traj.metadata[KEY]
    assert turns[0] == (start, start, False)
    assert turns[1][0] == start and turns[1][1] >= start and turns[1][2]
    for before, after, valid in turns[2:]:
        assert valid and after == before - 1
    assert turns[-1][1] == 0
    assert all(a == b for (_, a, _), (b, _, _) in zip(turns, turns[1:], strict=False))
