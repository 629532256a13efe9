"""OpenEnv's web playground on our server (`serve-openenv --web`), played by a person's clicks in headless
Chromium: Reset shows the seeded task, the oracle's replies typed into the form and sent with Step win it, and
Get state says so. Its screenshot, docs/images/openenv_playground.png (docs/integrations.md shows it), is
regenerated with `python tests/test_openenv_playground.py`."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install -e '.[integrations]')")

from server_targets import ROOT, TARGETS, start  # noqa: E402

from agentgym_opsd.environments.webshop.browser import CHROMIUM_FLAGS, _binaries, browser_available  # noqa: E402
from agentgym_opsd.integrations.openenv_env import (  # noqa: E402
    AgentAction,
    AgentGymEnvironment,
    AgentObservation,
    SessionSettings,
)
from agentgym_opsd.parsers import make_parser  # noqa: E402
from agentgym_opsd.registry import env_profile  # noqa: E402

_OK, _WHY = browser_available()
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not _OK, reason=f"no headless Chromium: {_WHY}")]

SPEC, SEED = "ALFWorld-v0:easy", 0
SCREENSHOT = ROOT / "docs" / "images" / "openenv_playground.png"
OPENENV = next(t for t in TARGETS if t.name == "openenv")

# The playground's parts, found by what a person sees: OpenEnv's Gradio page gives them no ids.
_OBSERVATION = "return document.querySelector('.col-right [data-testid=\"markdown\"]').innerText"
_STATUS = "return document.querySelectorAll('.col-right textarea')[1].value"
_RAW_JSON = "return document.querySelector('.col-right .cm-content').innerText"


def oracle_episode() -> tuple[AgentObservation, list[str]]:
    """The seeded task's first observation and the expert's replies, played in this process (the server plays
    the same episode)."""
    env = AgentGymEnvironment(SessionSettings(SPEC, oracle=True, seed=SEED))
    parser = make_parser(env_profile(env.env_id).parser)
    first = obs = env.reset()
    replies: list[str] = []
    while not obs.done:
        assert obs.oracle_action, "the oracle ran out before the episode ended"
        replies.append(parser.format(obs.oracle_action))
        obs = env.step(AgentAction(text=replies[-1]))
    assert obs.won
    env.close()
    return first, replies


@pytest.fixture()
def chromium() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = _binaries()
    profile = tempfile.mkdtemp(prefix="openenv-playground-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(browser)
    for flag in (*CHROMIUM_FLAGS, "--window-size=1400,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:  # noqa: BLE001 - the page is still rendering: any lookup may fail until it has
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"the playground did not show {what} within {timeout_s:g} s")


def test_the_playground_plays_an_oracle_episode_to_a_win(chromium: Any, tmp_path: Path) -> None:
    play_and_screenshot(chromium, tmp_path / "playground.png")


def play_and_screenshot(chromium: Any, screenshot: Path) -> None:
    from selenium.webdriver.common.by import By

    first, replies = oracle_episode()
    with start(OPENENV, "--web", "--seed", str(SEED)) as server:
        chromium.get(f"{server.url}/web/")
        button = {name: wait_for(lambda n=name: next(b for b in chromium.find_elements(By.TAG_NAME, "button")
                                                     if b.text == n), f"the {name} button")
                  for name in ("Reset", "Step", "Get state")}
        button["Reset"].click()
        wait_for(lambda: chromium.execute_script(_STATUS) == "Environment reset successfully.", "the reset")
        shown = chromium.execute_script(_OBSERVATION)
        assert f"Task: {first.task_text}" in shown and "Done: False" in shown, shown  # the seeded task
        assert '"oracle_action": null' in chromium.execute_script(_RAW_JSON)  # the server was not given --oracle
        text_box = chromium.find_elements(By.CSS_SELECTOR, ".col-right textarea")[0]
        for reply in replies:
            text_box.clear()
            text_box.send_keys(reply)
            button["Step"].click()
            shown = wait_for(lambda before=shown: (now := chromium.execute_script(_OBSERVATION)) != before and now,
                             f"the answer to {reply!r}")
        assert "Done: True" in shown and "Reward: 1.0" in shown, shown
        chromium.save_screenshot(str(screenshot))  # the won episode: before Get state replaces the JSON
        button["Get state"].click()
        state = wait_for(lambda: json.loads(chromium.execute_script(_RAW_JSON)).get("won") is not None
                         and json.loads(chromium.execute_script(_RAW_JSON)), "the state")
    assert state["won"] and state["done"] and state["step_count"] == len(replies)
    assert state["num_invalid_actions"] == 0 and state["task_id"] == first.task_id
    assert screenshot.stat().st_size > 10_000


if __name__ == "__main__":  # regenerate docs/images/openenv_playground.png
    with contextlib.contextmanager(chromium.__wrapped__)() as driver:  # type: ignore[attr-defined]
        play_and_screenshot(driver, SCREENSHOT)
