"""Environment fuzz, CI-sized: 3,000 random and hostile actions per environment (ALFWorld, WebShop, Search-QA and
the example plugin). No action may crash an environment; every answer is a string with the standard info keys;
an episode that ends is reset. The slowest step is printed (`-s`), never asserted on."""

from __future__ import annotations

import random
import time

import pytest
from search_qa_helpers import tiny_search_qa_kwargs
from test_webshop_helpers import SMALL

from agentgym_opsd.core import INFO_KEYS
from agentgym_opsd.registry import make

ACTIONS_PER_ENV = 3_000
HOSTILE = [
    "", " ", "\n\n", "\x00", "\x1b[31m", "\ud800", "🙂" * 50, "a" * 20_000, "<action>", "</action>", "<action></action>",
    "<action>" + "go to " * 500 + "</action>", "search[", "search[]", "click[", "click[]]]", "click[[[", "]" * 100,
    "<search></search>", "<answer></answer>", "<search>" + "x" * 5_000 + "</search>", "<answer>\x00</answer>",
    "{}", "null", "None", "NaN", "-1", "1e999", "'; DROP TABLE goals; --", "<script>alert(1)</script>",
    "%s%s%s%n", "../../../../etc/passwd", "think[" + "z" * 3_000 + "]", "search[<b>x</b>]", "click[back to search]",
    "click[next >]", "click[< prev]", "click[buy now]", "go to", "take from", "put in/on", "open", "use",
]


def _actions(rng: random.Random, admissible: list[str] | None) -> str:
    roll = rng.random()
    if admissible and roll < 0.35:
        return rng.choice(admissible)
    if roll < 0.6:
        return rng.choice(HOSTILE)
    if roll < 0.8:  # random unicode of random length (surrogates and controls included)
        return "".join(chr(rng.randrange(0, 0x2FFFF)) for _ in range(rng.randrange(0, 64)))
    words = ["go", "to", "take", "from", "search", "click", "<action>", "</action>", "[", "]", "<search>",
             "</search>", "<answer>", "</answer>", "1", "desk", "mug", "buy now"]
    return " ".join(rng.choice(words) for _ in range(rng.randrange(1, 12)))


@pytest.mark.parametrize("name", ["alfworld", "webshop", "search_qa", "lights"])
def test_thousands_of_hostile_actions_never_crash_an_environment(name, tmp_path_factory, capsys) -> None:
    if name == "alfworld":
        pytest.importorskip("textworld")
    if name == "lights":
        pytest.importorskip("agentgym_lights")
    spec, kwargs = {
        "alfworld": ("agentgym_opsd/ALFWorld-v0:easy", {"max_turns": 50}),
        "webshop": ("agentgym_opsd/WebShop-v0:test", {"num_products": SMALL}),
        "search_qa": ("agentgym_opsd/SearchQA-v0:test", {}),
        "lights": ("agentgym_opsd/Lights-v0:test", {}),
    }[name]
    if name == "search_qa":
        kwargs = tiny_search_qa_kwargs(tmp_path_factory.mktemp("fuzz-sqa"))
    env = make(spec, **kwargs)
    rng = random.Random(1234)
    slowest, episodes = 0.0, 1
    try:
        obs, info = env.reset(seed=0)
        for i in range(ACTIONS_PER_ENV):
            action = _actions(rng, info.get("admissible_actions"))
            t0 = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            slowest = max(slowest, time.perf_counter() - t0)
            assert isinstance(obs, str) and isinstance(reward, float)
            assert all(k in info for k in INFO_KEYS), (i, action[:80])
            if terminated or truncated:
                obs, info = env.reset(seed=i)
                episodes += 1
    finally:
        env.close()
    with capsys.disabled():
        print(f"\n{name}: {ACTIONS_PER_ENV} actions over {episodes} episodes, slowest step {1000 * slowest:.1f} ms")
