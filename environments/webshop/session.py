"""One shopper's session: the state machine behind the pages (search -> results -> item -> detail -> done).

`ShopSession.act("search[red shirt]")` / `act("click[next >]")` applies one action and says whether it was
valid; `page()` renders the current page. Actions are read as the original reads them (`parse_action`):
`search[...]` works on every page (the search bar is only *shown* on the search page), `click[...]` needs the
lower-cased argument to be a clickable of the page, and `think[...]` is a valid action that changes nothing.
Invalid actions (anything else, a click on a name that is not on the page, a query over MAX_QUERY_CHARS,
anything after the purchase) change nothing either; they differ from `think` only in being reported invalid
(the original has no notion of invalid, so nothing is penalised there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agentgym_opsd.environments.webshop.models import Goal, Product
from agentgym_opsd.environments.webshop.pages import (
    BACK_TO_SEARCH,
    BUY_NOW,
    DETAIL_KINDS,
    NEXT,
    PREV,
    Page,
    detail_page,
    done_page,
    item_page,
    normalize_text,
    results_page,
    search_page,
)
from agentgym_opsd.environments.webshop.reward import RewardBreakdown, score_purchase
from agentgym_opsd.environments.webshop.shop import MAX_RESULTS, RESULTS_PER_PAGE, Shop

__all__ = ["ShopSession", "ActionResult", "SessionView", "parse_action", "MAX_QUERY_CHARS"]

MAX_QUERY_CHARS = 500
"""Longer search queries are invalid actions (no real query is that long)."""

THINK = "think"
"""The verb of a reasoning step (ReAct's `think[...]`): accepted, and nothing changes, as in the original."""

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def parse_action(action: str) -> tuple[str, str] | None:
    """(verb, argument) the way the original splits an action, else None.

    Only the first line counts. The argument runs from the last "[" that has a "]" at least one character
    later up to the last "]" of the line; the verb is everything before that "[", unchanged (so "Search[x]"
    and " search[x]" are not searches, as there); text after the last "]" is ignored. Example:
    "search[shirt [large]] please" -> ("search[shirt ", "large]")."""
    if not isinstance(action, str):
        return None
    line = action.split("\n", 1)[0]
    close = line.rfind("]")
    opening = line.rfind("[", 1, close - 1) if close >= 3 else -1
    if opening < 1:
        return None
    return line[:opening], line[opening + 1:close]


@dataclass(frozen=True)
class ActionResult:
    """`valid` is False when the action did nothing; `reason` says why; `done` after the purchase."""

    valid: bool
    reason: str = ""
    done: bool = False


@dataclass(frozen=True)
class SessionView:
    """What the oracle needs to know about a session (JSON-serialisable; the server sends it)."""

    kind: str
    page_asins: list[str]
    has_next: bool
    item_asin: str
    chosen: dict[str, str]
    num_searches: int
    done: bool


@dataclass
class ShopSession:
    shop: Shop
    goal: Goal
    kind: str = "search"
    query: str = ""
    results: list[Product] = field(default_factory=list)
    page_num: int = 1
    item: Product | None = None
    detail: str = ""
    chosen: dict[str, str] = field(default_factory=dict)
    num_searches: int = 0
    reward: RewardBreakdown | None = None
    purchased: Product | None = None

    # ---- rendering -------------------------------------------------------------------------------------
    def page(self) -> Page:
        if self.kind == "search":
            return search_page(self.goal)
        if self.kind == "results":
            start = (self.page_num - 1) * RESULTS_PER_PAGE
            shown = self.results[start:start + RESULTS_PER_PAGE]
            return results_page(self.goal, shown, self.page_num, len(self.results), RESULTS_PER_PAGE)
        assert self.item is not None
        if self.kind == "item":
            return item_page(self.goal, self.item, self.chosen)
        if self.kind == "detail":
            return detail_page(self.goal, self.item, self.detail)
        assert self.reward is not None
        return done_page(self.goal, self.item, self.chosen, self.reward.score)

    @property
    def done(self) -> bool:
        return self.kind == "done"

    @property
    def score(self) -> float:
        return self.reward.score if self.reward else 0.0

    def view(self) -> SessionView:
        start = (self.page_num - 1) * RESULTS_PER_PAGE
        on_page = self.results[start:start + RESULTS_PER_PAGE] if self.kind == "results" else []
        return SessionView(
            kind=self.kind,
            page_asins=[p.asin for p in on_page],
            has_next=self.kind == "results" and self.page_num * RESULTS_PER_PAGE < len(self.results),
            item_asin=self.item.asin if self.item is not None and self.kind in ("item", "detail") else "",
            chosen=dict(self.chosen),
            num_searches=self.num_searches,
            done=self.done,
        )

    def admissible_actions(self, page: Page | None = None) -> list[str]:
        """The current clickables as `click[...]`, plus `search[<your query>]` when the search bar is shown."""
        page = page or self.page()
        actions = [f"click[{name}]" for name in page.clickables]
        if page.has_search:
            actions.append("search[<your query>]")
        return actions

    # ---- actions ---------------------------------------------------------------------------------------
    def act(self, action: str) -> ActionResult:
        if self.done:
            return ActionResult(False, "the purchase is complete", done=True)
        parsed = parse_action(action)
        if parsed is None:
            return ActionResult(False, "expected search[query] or click[name]")
        verb, argument = parsed
        if verb == "search":
            return self._search(argument.lower())
        if verb == "click":
            return self._click(argument.lower())
        if verb == THINK:
            return ActionResult(True, "thought noted; nothing changes")
        return ActionResult(False, "expected search[query], click[name] or think[thought]")

    def _search(self, query: str) -> ActionResult:
        if len(query) > MAX_QUERY_CHARS:
            return ActionResult(False, f"search query longer than {MAX_QUERY_CHARS} characters")
        query = normalize_text(_CONTROL_CHARS.sub(" ", query))
        self.query = query
        self.results = self.shop.search(query)[:MAX_RESULTS]
        self.page_num = 1
        self.num_searches += 1
        self.kind = "results"
        return ActionResult(True)

    def _click(self, name: str) -> ActionResult:
        page = self.page()
        if name not in page.clickables or name == "search":
            return ActionResult(False, f"'{name[:80]}' is not a clickable on this page")
        if name == BACK_TO_SEARCH.lower():
            self.kind, self.item, self.chosen, self.results, self.page_num = "search", None, {}, [], 1
        elif name == NEXT.lower() and self.kind == "results":
            self.page_num += 1
        elif name == PREV.lower():
            self._go_back()
        elif self.kind == "results":  # a product id
            self.item = self.shop.by_asin[next(p.asin for p in self.results if p.asin.lower() == name)]
            self.kind, self.chosen = "item", {}
        elif self.kind == "item":
            return self._click_item(name)
        return ActionResult(True)

    def _go_back(self) -> None:
        if self.kind == "results":
            self.page_num -= 1
        elif self.kind == "item":
            self.kind, self.item, self.chosen = "results", None, {}
        elif self.kind == "detail":
            self.kind = "item"

    def _click_item(self, name: str) -> ActionResult:
        assert self.item is not None
        if name == BUY_NOW.lower():
            # The original scores the clicked (lower-cased) option texts.
            self.reward = score_purchase(self.goal, self.item, [v.lower() for v in self.chosen.values()])
            self.purchased = self.item
            self.kind = "done"
            return ActionResult(True, done=True)
        if name in DETAIL_KINDS:
            self.kind, self.detail = "detail", name
            return ActionResult(True)
        for group, values in self.item.options.items():
            for value in values:
                if value.lower() == name:
                    self.chosen[group] = value
                    return ActionResult(True)
        return ActionResult(False, f"'{name[:80]}' is not a clickable on this page")
