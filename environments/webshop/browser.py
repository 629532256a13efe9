"""Selenium adapter: headless Chromium driving the shop site; observations read from the DOM.

Only this module imports selenium. Chromium runs with a throw-away profile and every background service
switched off, because on a closed network those services (updates, sync, QUIC probes) stall page loads.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.environments.webshop.pages import BACK_TO_SEARCH, SEP
from agentgym_opsd.environments.webshop.session import (
    MAX_QUERY_CHARS,
    THINK,
    ActionResult,
    SessionView,
    parse_action,
)

__all__ = ["BrowserShopper", "browser_available", "CHROMIUM_FLAGS"]

CHROMIUM_FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",  # /dev/shm is small in containers; Chromium crashes without this
)

_READ_PAGE = """
const obs = Array.from(document.querySelectorAll('[data-obs]'))
  .map(e => e.textContent.replace(/\\s+/g, ' ').trim());
const clicks = Array.from(document.querySelectorAll('[data-click]')).map(e => e.getAttribute('data-click'));
return [obs, clicks, document.querySelector('[data-search]') !== null];
"""
_FIND_CLICK = "return Array.from(document.querySelectorAll('[data-click]')).find(e => e.getAttribute('data-click') === arguments[0]) || null;"


def _binaries() -> tuple[str | None, str | None]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    return browser, shutil.which("chromedriver")


def browser_available() -> tuple[bool, str]:
    """(True, "") when Chromium, chromedriver and selenium are all present, else (False, what is missing)."""
    browser, driver = _binaries()
    missing = [name for name, path in (("chromium", browser), ("chromedriver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    if missing:
        return False, "missing " + ", ".join(missing) + " (Debian: apt-get install chromium chromium-driver)"
    return True, ""


@dataclass
class _DomPage:
    segments: list[str]
    clickables: list[str]
    has_search: bool


class BrowserShopper:
    """One headless Chromium on one shop session at a time."""

    def __init__(self, base_url: str, *, page_load_timeout_s: float = 30.0) -> None:
        ok, why = browser_available()
        if not ok:
            raise RuntimeError(f"browser mode needs Chromium: {why}")
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        browser, driver_path = _binaries()
        self.base_url = base_url.rstrip("/")
        self._profile = tempfile.mkdtemp(prefix="webshop-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = str(browser)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={self._profile}"):
            options.add_argument(flag)
        self._driver = webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path)))
        self._driver.set_page_load_timeout(page_load_timeout_s)
        self.page_load_timeout_s = page_load_timeout_s
        self.sid = ""
        self._page: _DomPage | None = None

    # ---- session ---------------------------------------------------------------------------------------
    def start(self, split: str, goal_index: int) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self._driver.get(f"{self.base_url}/new?split={split}&goal={goal_index}")
        self._driver.find_element(By.ID, "start-session").click()  # only a POST creates a session
        WebDriverWait(self._driver, self.page_load_timeout_s).until(lambda d: "/s/" in d.current_url)
        self.sid = self._driver.current_url.rstrip("/").rsplit("/", 1)[-1]
        self._page = None

    def close_session(self) -> None:
        if self.sid:
            request = urllib.request.Request(f"{self.base_url}/api/sessions/{self.sid}", method="DELETE")
            with urllib.request.urlopen(request, timeout=10):
                pass
            self.sid = ""

    def quit(self) -> None:
        try:
            self._driver.quit()
        finally:
            shutil.rmtree(self._profile, ignore_errors=True)

    # ---- reading ---------------------------------------------------------------------------------------
    def _read(self) -> _DomPage:
        if self._page is None:
            segments, clickables, has_search = self._driver.execute_script(_READ_PAGE)
            self._page = _DomPage(list(segments), list(clickables), bool(has_search))
        return self._page

    def observation(self) -> str:
        return SEP.join(self._read().segments)

    def admissible_actions(self) -> list[str]:
        page = self._read()
        return [f"click[{c}]" for c in page.clickables] + (["search[<your query>]"] if page.has_search else [])

    def state(self) -> dict[str, object]:
        with urllib.request.urlopen(f"{self.base_url}/s/{self.sid}/state.json", timeout=10) as response:
            return json.loads(response.read().decode("utf-8"))

    def view(self) -> SessionView:
        state = self.state()
        fields = SessionView.__dataclass_fields__
        return SessionView(**{k: v for k, v in state.items() if k in fields})  # type: ignore[arg-type]

    # ---- acting ----------------------------------------------------------------------------------------
    def act(self, action: str) -> ActionResult:
        """Validate against the DOM (as the site shows it), then type or click like a user."""
        from selenium.webdriver.common.by import By

        parsed = parse_action(action)
        if parsed is None:
            return ActionResult(False, "expected search[query], click[name] or think[thought]")
        verb, argument = parsed
        if verb == THINK:  # as in text mode: a reasoning step, valid, nothing on the site changes
            return ActionResult(True, "thought noted; nothing changes")
        if verb not in ("search", "click"):
            return ActionResult(False, "expected search[query], click[name] or think[thought]")
        page = self._read()
        if verb == "search" and not page.has_search:
            # text mode (and the original) search from any page: a user goes back to the search bar first
            if BACK_TO_SEARCH.lower() not in page.clickables:
                return ActionResult(False, "there is no way back to the search bar from this page")
            if len(argument) > MAX_QUERY_CHARS:
                return ActionResult(False, f"search query longer than {MAX_QUERY_CHARS} characters")
            self._click_and_wait(BACK_TO_SEARCH.lower())
            page = self._read()
        old_root = self._driver.find_element(By.TAG_NAME, "html")
        if verb == "search":
            if len(argument) > MAX_QUERY_CHARS:
                return ActionResult(False, f"search query longer than {MAX_QUERY_CHARS} characters")
            box = self._driver.find_element(By.CSS_SELECTOR, "[data-search]")
            box.clear()
            box.send_keys(argument)
            box.submit()
        else:
            name = argument.lower()
            if name not in page.clickables:
                return ActionResult(False, f"'{name[:80]}' is not a clickable on this page")
            self._driver.execute_script(_FIND_CLICK, name).click()
        self._wait_replaced(old_root)
        return ActionResult(True, done=name == "buy now" if verb == "click" else False)

    def _wait_replaced(self, old_root: Any) -> None:
        """A form submit or click navigates asynchronously: wait until the old document is gone. Chromium
        reports a replaced node either as stale or as "node does not belong to the document"; both mean gone."""
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.support.ui import WebDriverWait

        def gone(_driver: Any) -> bool:
            try:
                old_root.is_enabled()
            except WebDriverException:
                return True
            return False

        WebDriverWait(self._driver, self.page_load_timeout_s).until(gone)
        self._page = None

    def _click_and_wait(self, name: str) -> None:
        from selenium.webdriver.common.by import By

        old_root = self._driver.find_element(By.TAG_NAME, "html")
        self._driver.execute_script(_FIND_CLICK, name).click()
        self._wait_replaced(old_root)
