"""The expert: from a goal and a session view, the next action that buys the target with the wanted
options. It searches the instruction — what the agent sees, so that a warm start imitating it learns queries it
can write (a search for the target's hidden title taught a warm-started model to invent product titles: 4%
held-out success) — pages through the results to the target, opens it, clicks each wanted option value and
buys. When the instruction's 50 results miss the target (under 1% of the generated goals) it searches the
target's title, then title and description. `oracle_distance` counts the
expert actions still needed from a session's state (the environment's `info["oracle_distance"]`)."""

from __future__ import annotations

import copy

from rapidfuzz import fuzz

from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.session import SessionView, ShopSession

__all__ = ["oracle_distance", "oracle_next_action", "wanted_option_values"]


def wanted_option_values(goal: Goal, product: Product) -> dict[str, str]:
    """group -> the product's value closest to each goal option (exact for generated goals; fuzzy for
    real data where the goal's wording can differ from the product's)."""
    wanted = {}
    for goal_group, goal_value in goal.options.items():
        best, best_score, best_group = "", -1.0, ""
        for group, values in product.options.items():
            for value in values:
                score = fuzz.token_set_ratio(goal_value.lower(), value.lower()) + (1 if group == goal_group else 0)
                if score > best_score:
                    best, best_score, best_group = value, score, group
        if best:
            wanted[best_group] = best
    return wanted


def oracle_next_action(goal: Goal, target: Product, view: SessionView) -> str:
    """The next expert action (raises ValueError when the session is already done)."""
    if view.done:
        raise ValueError("the session is done; there is no next action")
    if view.kind == "search":
        # Product ids are not indexed (as in the original), so the last try adds the description instead.
        queries = (goal.instruction, target.name, f"{target.name} {target.description}")
        return f"search[{queries[min(view.num_searches, len(queries) - 1)]}]"
    if view.kind == "results":
        if target.asin in view.page_asins:
            return f"click[{target.asin.lower()}]"
        return "click[next >]" if view.has_next else "click[back to search]"
    if view.kind == "detail" or view.item_asin != target.asin:
        return "click[< prev]"
    for group, value in wanted_option_values(goal, target).items():
        if view.chosen.get(group) != value:
            return f"click[{value.lower()}]"
    return "click[buy now]"


_MAX_SIMULATED_ACTIONS = 200
"""A bound on the simulated expert (it pages through at most MAX_RESULTS results twice, then buys)."""


def oracle_distance(goal: Goal, target: Product, session: ShopSession) -> int | None:
    """How many expert actions are still needed from this session's state: the expert is played on a copy
    of the session until it buys. 0 once the purchase scored 1; None after a purchase that scored less
    (the goal can no longer be reached) or if the expert does not finish."""
    if session.done:
        return 0 if session.score >= 1.0 else None
    sim = copy.copy(session)
    sim.chosen = dict(session.chosen)  # the one field `act` mutates in place; the others are reassigned
    for steps in range(1, _MAX_SIMULATED_ACTIONS + 1):
        if not sim.act(oracle_next_action(goal, target, sim.view())).valid:
            return None  # the expert cannot go on from here (never seen; a guard, not a case)
        if sim.done:
            return steps
    return None
