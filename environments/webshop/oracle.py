"""The expert: from a goal and a session view, the next action that buys a product satisfying the goal with
the wanted options. It acts on what the agent sees wherever it can, so that a warm start imitating it learns
choices it can make:
- it searches the instruction (a search for the target's hidden title taught a warm-started model to invent
  product titles: 4% held-out success);
- given the catalogue, it opens the result on the current page that satisfies the goal and whose title shows
  the most of the goal's attributes (then the higher-ranked one), not necessarily the hidden target: on page 1
  of 200 generated goals 2.1 results satisfy the goal on average, and an expert always opening the target chose
  against the titles so often that the warm start learned 15% of its product clicks;
- it pages on when no result on the page satisfies the goal, clicks each wanted option value and buys.
Without the catalogue it opens the target only. When the instruction's 50 results miss every satisfying product
(under 1% of the generated goals) it searches the target's title, then title and description.
`oracle_distance` counts the expert actions still needed from a session's state (the environment's
`info["oracle_distance"]`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from rapidfuzz import fuzz

from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.reward import score_purchase
from agentgym_opsd.environments.webshop.session import SessionView, ShopSession

__all__ = ["expert_pick", "oracle_distance", "oracle_next_action", "satisfies", "wanted_option_values"]


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


def satisfies(goal: Goal, product: Product) -> bool:
    """Whether buying `product` with the goal's options (its closest values) scores 1."""
    return score_purchase(goal, product, wanted_option_values(goal, product).values()).score >= 1.0


def _title_evidence(goal: Goal, product: Product) -> int:
    """How many of the goal's attributes the product's title shows (what the agent can read on the page)."""
    title = product.name.lower()
    return sum(attribute.lower() in title for attribute in goal.attributes)


def expert_pick(goal: Goal, target: Product, page_asins: list[str],
                catalog: Mapping[str, Product] | None) -> str | None:
    """The asin the expert opens from a results page: the target without a catalogue; with one, of the
    page's products that satisfy the goal the one whose title shows the most goal attributes (ties: the
    higher-ranked). None when no result on the page qualifies."""
    if catalog is None:
        return target.asin if target.asin in page_asins else None
    best, best_evidence = None, -1
    for asin in page_asins:
        product = target if asin == target.asin else catalog.get(asin)
        if product is None or not satisfies(goal, product):
            continue
        evidence = _title_evidence(goal, product)
        if evidence > best_evidence:
            best, best_evidence = asin, evidence
    return best


def oracle_next_action(goal: Goal, target: Product, view: SessionView,
                       catalog: Mapping[str, Product] | None = None) -> str:
    """The next expert action (raises ValueError when the session is already done). `catalog` (asin ->
    product) lets the expert buy any product that satisfies the goal (module docstring)."""
    if view.done:
        raise ValueError("the session is done; there is no next action")
    if view.kind == "search":
        # Product ids are not indexed (as in the original), so the last try adds the description instead.
        queries = (goal.instruction, target.name, f"{target.name} {target.description}")
        return f"search[{queries[min(view.num_searches, len(queries) - 1)]}]"
    if view.kind == "results":
        pick = expert_pick(goal, target, view.page_asins, catalog)
        if pick is not None:
            return f"click[{pick.lower()}]"
        return "click[next >]" if view.has_next else "click[back to search]"
    item = target if view.item_asin == target.asin else (catalog or {}).get(view.item_asin)
    if view.kind == "detail" or item is None or not (item is target or satisfies(goal, item)):
        return "click[< prev]"
    for group, value in wanted_option_values(goal, item).items():
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
        if not sim.act(oracle_next_action(goal, target, sim.view(), session.shop.by_asin)).valid:
            return None  # the expert cannot go on from here (never seen; a guard, not a case)
        if sim.done:
            return steps
    return None
