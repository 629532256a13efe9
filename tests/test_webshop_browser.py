"""Browser mode: headless Chromium on the site gives the same observations as text mode."""

from __future__ import annotations

import pytest
from test_webshop_helpers import SMALL, small_shop

from agentgym_opsd.environments.webshop.browser import browser_available
from agentgym_opsd.environments.webshop.env import WebShopEnv
from agentgym_opsd.environments.webshop.server import ShopServer
from agentgym_opsd.environments.webshop.session import ShopSession

_OK, _WHY = browser_available()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not _OK, reason=f"browser mode unavailable: {_WHY}")]


@pytest.fixture(scope="module")
def envs():
    text = WebShopEnv(mode="text", split="test", num_products=SMALL)
    browser = WebShopEnv(mode="browser", split="test", num_products=SMALL)
    yield text, browser
    browser.close()


def test_same_observations_and_oracle_wins(envs) -> None:
    text, browser = envs
    for index in (0, 3):
        t_obs, t_info = text.reset(options={"task_index": index})
        b_obs, b_info = browser.reset(options={"task_index": index})
        assert t_obs == b_obs and t_info["admissible_actions"] == b_info["admissible_actions"]
        script = ["click[nope]", "search[cotton black]", "click[next >]", "think[the first page was better]",
                  "click[< prev]", "search[cotton]", "look[around]", "click[back to search]"]
        for action in script:
            t, b = text.step(action), browser.step(action)
            assert t[0] == b[0], action
            assert t[4]["action_valid"] == b[4]["action_valid"] and t[4]["admissible_actions"] == b[4]["admissible_actions"]
        while True:
            action = text.unwrapped.oracle_action() if hasattr(text, "unwrapped") else text.oracle_action()
            assert browser.oracle_action() == action
            t, b = text.step(action), browser.step(action)
            assert t[0] == b[0] and t[1] == b[1]
            if t[2]:
                break
        assert b[1] == 1.0 and b[4]["won"]


def test_hostile_text_shows_as_text() -> None:
    from agentgym_opsd.environments.webshop.browser import BrowserShopper

    shop = small_shop(with_hostile=True)
    evil = len(shop.goals["test"]) - 1
    with ShopServer(shop) as server:
        shopper = BrowserShopper(server.url)
        try:
            shopper.start("test", evil)
            session = ShopSession(shop, shop.goals["test"][evil])
            for action in ['search[<script>alert(1)</script> evil]', "click[b0evil0001]", "click[features]"]:
                assert shopper.act(action).valid == session.act(action).valid
                assert shopper.observation() == session.page().observation()
                assert "alert" not in shopper._driver.execute_script("return window.name || ''")
            assert "<img src=x onerror=alert(1)>" in shopper.observation()
        finally:
            shopper.quit()
