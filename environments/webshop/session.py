"""One shopper's session: the state machine behind the pages (search -> results -> item -> detail -> done).

`ShopSession.act("search[red shirt]")` / `act("click[next >]")` applies one action and says whether it was
valid; `page()` renders the current page. Invalid actions (malformed text, a click on a name that is not on
the page, search where no search bar is shown, anything after the purchase) change nothing.
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

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_ACTION = re.compile(r"^\s*(search|click)\[(.*)\]\s*$", re.DOTALL | re.IGNORECASE)


def parse_action(action: str) -> tuple[str, str] | None:
    """`search[x]` / `click[x]` -> (verb, normalised argument); None when malformed or empty."""
    if not isinstance(action, str):
        return None
    match = _ACTION.match(action)
    if match is None:
        return None
    argument = normalize_text(_CONTROL_CHARS.sub(" ", match.group(2)))
    return (match.group(1).lower(), argument) if argument else None


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
            return self._search(argument)
        return self._click(argument.lower())

    def _search(self, query: str) -> ActionResult:
        if self.kind != "search":
            return ActionResult(False, "there is no search bar on this page (click 'back to search' first)")
        if len(query) > MAX_QUERY_CHARS:
            return ActionResult(False, f"search query longer than {MAX_QUERY_CHARS} characters")
        self.query = query
        self.results = self.shop.search(query)[:MAX_RESULTS]
        self.page_num = 1
        self.num_searches += 1
        self.kind = "results"
        return ActionResult(True)

    def _click(self, name: str) -> ActionResult:
        page = self.page()
        if name not in page.clickables:
            return ActionResult(False, f"'{name[:80]}' is not a clickable on this page")
        if name == BACK_TO_SEARCH.lower():
            self.kind, self.item, self.chosen, self.results, self.page_num = "search", None, {}, [], 1
        elif name == NEXT.lower() and self.kind == "results":
            self.page_num += 1
        elif name == PREV.lower():
            self._go_back()
        elif self.kind == "results":
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
            self.reward = score_purchase(self.goal, self.item, self.chosen.values())
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
