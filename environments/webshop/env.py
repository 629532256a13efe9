"""`WebShop-v0`: the shop behind the turn API, in `text` mode (pages rendered in-process) or `browser`
mode (headless Chromium on the running site, observations read from the DOM).

Observation: the page's visible strings joined by " [SEP] " (the instruction on every page, as in the original).
Actions: `search[query]` (on any page, as in the original) and `click[name]` (a current clickable,
lower-cased); `think[...]` is valid and changes nothing. `admissible_actions`: the clickables as `click[...]`, plus
the literal hint `search[<your query>]` when the search bar shows. Only `click[buy now]` ends the episode, with
reward the WebShop score in [0, 1] and `info["won"]` iff it is 1; invalid actions change nothing and set
`info["action_valid"] = False`. `info["oracle_distance"]` (reset and every step; None in browser mode): expert
actions still needed, 0 after a purchase that scored 1, None after one that scored less. `info["privileged_hints"]`
(reset), for the self-teacher only: `goal`, the target's title and ASIN, attributes, options and price cap.
"""

from __future__ import annotations

from typing import Any, Protocol

from agentgym_opsd.core import (
    ACTION_VALID,
    ADMISSIBLE_ACTIONS,
    ORACLE_DISTANCE,
    PRIVILEGED_HINTS,
    SCORE,
    TASK_ID,
    TASK_TEXT,
    TASK_TYPE,
    WON,
    EpisodeEndedError,
    TextEnv,
)
from agentgym_opsd.environments.webshop.models import Goal
from agentgym_opsd.environments.webshop.oracle import oracle_distance, oracle_next_action
from agentgym_opsd.environments.webshop.session import ActionResult, SessionView, ShopSession
from agentgym_opsd.environments.webshop.shop import DEFAULT_NUM_PRODUCTS, Shop, load_shop

__all__ = ["WebShopEnv", "MODES", "ORACLE_DISTANCE"]

MODES = ("text", "browser")
"""`text`: pages rendered in-process; `browser`: the same shop served over HTTP and driven by Selenium (headless Chromium)."""


def goal_hint(goal: Goal, title: str) -> str:
    """The `goal` hint level: what to buy, as facts the results pages only reveal by search and clicks."""
    parts = [f"The product to buy is '{title}' (ASIN {goal.asin.upper()})."]
    if goal.attributes:
        parts.append("It must be: " + ", ".join(goal.attributes) + ".")
    if goal.options:
        parts.append("Choose " + ", ".join(f"{k}: {v}" for k, v in goal.options.items()) + ".")
    parts.append(f"Its price must be at most ${goal.price_upper:.2f}.")
    return " ".join(parts)


class _Backend(Protocol):
    def start(self, split: str, goal_index: int) -> None: ...
    def act(self, action: str) -> ActionResult: ...
    def observation(self) -> str: ...
    def admissible_actions(self) -> list[str]: ...
    def view(self) -> SessionView: ...
    def score(self) -> float: ...
    def close(self) -> None: ...


class _TextBackend:
    """Pages rendered in-process from a ShopSession (no server, no browser)."""

    def __init__(self, shop: Shop) -> None:
        self.shop = shop
        self.session: ShopSession | None = None

    def start(self, split: str, goal_index: int) -> None:
        self.session = ShopSession(self.shop, self.shop.split_goals(split)[goal_index])

    def _s(self) -> ShopSession:
        if self.session is None:
            raise RuntimeError("call reset() first")
        return self.session

    def act(self, action: str) -> ActionResult:
        return self._s().act(action)

    def observation(self) -> str:
        return self._s().page().observation()

    def admissible_actions(self) -> list[str]:
        return self._s().admissible_actions()

    def view(self) -> SessionView:
        return self._s().view()

    def score(self) -> float:
        return self._s().score

    def close(self) -> None:
        self.session = None


class _BrowserBackend:
    """Chromium on the shop site: our own server in a thread unless `server_url` names a running one
    (which must serve the same catalogue)."""

    def __init__(self, shop: Shop, server_url: str | None) -> None:
        from agentgym_opsd.environments.webshop.browser import BrowserShopper
        from agentgym_opsd.environments.webshop.server import ShopServer

        self._server = None if server_url else ShopServer(shop).start()
        self.shopper = BrowserShopper(server_url or self._server.url)  # type: ignore[union-attr]

    def start(self, split: str, goal_index: int) -> None:
        self.shopper.close_session()
        self.shopper.start(split, goal_index)

    def act(self, action: str) -> ActionResult:
        return self.shopper.act(action)

    def observation(self) -> str:
        return self.shopper.observation()

    def admissible_actions(self) -> list[str]:
        return self.shopper.admissible_actions()

    def view(self) -> SessionView:
        return self.shopper.view()

    def score(self) -> float:
        return float(self.shopper.state().get("score", 0.0))  # type: ignore[arg-type]

    def close(self) -> None:
        try:
            self.shopper.close_session()
            self.shopper.quit()
        finally:
            if self._server is not None:
                self._server.stop()


class WebShopEnv(TextEnv):
    """WebShop over a generated catalogue (or the real data when `data_dir` is given).

    Args:
        mode: "text" (default, in-process) or "browser" (selenium + headless Chromium).
        split: "train" or "test" goals.
        num_products / catalogue_seed: size and seed of the generated catalogue.
        data_dir: folder with the real WebShop files (see loaders.py) instead of the generator.
        server_url: browser mode only: use this running site instead of starting one.
    """

    def __init__(self, *, mode: str = "text", split: str = "train", max_turns: int = 15,
                 num_products: int = DEFAULT_NUM_PRODUCTS, catalogue_seed: int = 0, data_dir: str | None = None,
                 server_url: str | None = None, render_mode: str | None = None) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.shop = load_shop(num_products, catalogue_seed, data_dir)
        self.goals = self.shop.split_goals(split)
        if not self.goals:
            raise ValueError(f"split {split!r} has no goals")
        self.split = split
        self._backend: _Backend = _TextBackend(self.shop) if mode == "text" else _BrowserBackend(self.shop, server_url)
        self._goal: Goal | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.goals)

    def _choose(self, options: dict[str, Any]) -> int:
        if "task_id" in options:
            ids = [g.goal_id for g in self.goals]
            if options["task_id"] not in ids:
                raise ValueError(f"unknown task_id {options['task_id']!r} for split {self.split!r}")
            return ids.index(options["task_id"])
        if "task_index" in options:
            index = int(options["task_index"])
            if not 0 <= index < self.num_tasks:
                raise ValueError(f"task_index must be in [0, {self.num_tasks}), got {index}")
            return index
        return int(self.np_random.integers(self.num_tasks))

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = self._choose(options)
        self._goal = self.goals[index]
        self._backend.start(self.split, index)
        goal = self._goal
        info = {TASK_ID: goal.goal_id, TASK_TYPE: goal.category, TASK_TEXT: goal.instruction,
                ADMISSIBLE_ACTIONS: self._backend.admissible_actions(), "target_asin": goal.asin,
                "category": goal.category, "price_upper": goal.price_upper, "split": self.split,
                "mode": self.mode, "task_index": index, ORACLE_DISTANCE: self._oracle_distance(),
                PRIVILEGED_HINTS: {"goal": goal_hint(goal, self.shop.by_asin[goal.asin].name)}}
        return self._backend.observation(), info

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        result = self._backend.act(action)
        observation = self._backend.observation()
        info: dict[str, Any] = {ACTION_VALID: result.valid, ADMISSIBLE_ACTIONS: self._backend.admissible_actions(),
                                ORACLE_DISTANCE: self._oracle_distance()}
        if not result.valid:
            info["invalid_reason"] = result.reason
        if result.valid and result.done:
            score = self._backend.score()
            info.update({SCORE: score, WON: score >= 1.0})
            return observation, score, True, info
        return observation, 0.0, False, info

    def oracle_action(self) -> str:
        if self._goal is None or self.episode_ended:
            raise EpisodeEndedError("the episode is over; call reset()")
        return oracle_next_action(self._goal, self.shop.by_asin[self._goal.asin], self._backend.view(),
                                  self.shop.by_asin)

    def _oracle_distance(self) -> int | None:
        if not isinstance(self._backend, _TextBackend) or self._backend.session is None or self._goal is None:
            return None
        return oracle_distance(self._goal, self.shop.by_asin[self._goal.asin], self._backend.session)

    def close(self) -> None:
        self._backend.close()
        super().close()
