"""WebShop benchmarks, measured side by side in one run:

- text mode: env steps per second (oracle episodes and random admissible clicks);
- server: JSON requests per second with 32 concurrent sessions;
- browser mode: mean step latency (skipped when Chromium is absent);
- search: build time and mean BM25 query latency over 10k and 100k generated products.

Run: python benchmarks/bench_webshop.py [--sizes 10000 100000] [--browser-steps 30]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

from agentgym_opsd.environments.webshop.browser import browser_available
from agentgym_opsd.environments.webshop.env import WebShopEnv
from agentgym_opsd.environments.webshop.generator import generate_goals, generate_products
from agentgym_opsd.environments.webshop.search import ProductSearch
from agentgym_opsd.environments.webshop.server import ShopServer
from agentgym_opsd.environments.webshop.shop import load_shop


def bench_text(episodes: int) -> list[tuple[str, str, str]]:
    env = WebShopEnv(split="train")
    rows = []
    steps, start = 0, time.perf_counter()
    for i in range(episodes):
        env.reset(options={"task_index": i})
        while True:
            *_, terminated, truncated, _ = env.step(env.oracle_action())
            steps += 1
            if terminated or truncated:
                break
    seconds = time.perf_counter() - start
    rows.append(("text mode, oracle episodes", f"{steps / seconds:,.0f} steps/s", f"{steps} steps"))
    rng = random.Random(0)
    steps, start = 0, time.perf_counter()
    for i in range(episodes):
        _, info = env.reset(options={"task_index": i})
        done = False
        while not done:
            actions = [a for a in info["admissible_actions"] if a != "search[<your query>]"] or ["search[shirt]"]
            *_, terminated, truncated, info = env.step(rng.choice(actions))
            steps += 1
            done = terminated or truncated
    seconds = time.perf_counter() - start
    rows.append(("text mode, random clicks", f"{steps / seconds:,.0f} steps/s", f"{steps} steps"))
    return rows


def _post(url: str, payload: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def bench_server(sessions: int, steps_per_session: int) -> list[tuple[str, str, str]]:
    with ShopServer(load_shop(), max_sessions=sessions * 2) as server:
        def worker(i: int) -> int:
            sid = _post(server.url + "/api/sessions", {"split": "train", "goal": i})["sid"]
            actions = ["search[cotton black shirt]", "click[next >]", "click[< prev]", "click[back to search]"]
            for k in range(steps_per_session):
                _post(f"{server.url}/api/sessions/{sid}/step", {"action": actions[k % len(actions)]})
            return steps_per_session + 1
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=sessions) as pool:
            total = sum(pool.map(worker, range(sessions)))
        seconds = time.perf_counter() - start
    return [(f"server, {sessions} concurrent sessions", f"{total / seconds:,.0f} requests/s", f"{total} requests")]


def bench_browser(steps: int) -> list[tuple[str, str, str]]:
    ok, why = browser_available()
    if not ok:
        return [("browser mode step latency", "skipped", why)]
    env = WebShopEnv(mode="browser", split="train")
    try:
        latencies = []
        i = 0
        while len(latencies) < steps:
            env.reset(options={"task_index": i})
            i += 1
            while True:
                action = env.oracle_action()
                start = time.perf_counter()
                *_, terminated, truncated, _ = env.step(action)
                latencies.append(time.perf_counter() - start)
                if terminated or truncated:
                    break
    finally:
        env.close()
    return [("browser mode step latency", f"{statistics.mean(latencies) * 1000:,.0f} ms mean",
             f"p90 {sorted(latencies)[int(0.9 * len(latencies))] * 1000:,.0f} ms, {len(latencies)} steps")]


def bench_search(sizes: list[int], queries: int) -> list[tuple[str, str, str]]:
    rows = []
    for size in sizes:
        start = time.perf_counter()
        products = generate_products(size)
        generated = time.perf_counter() - start
        start = time.perf_counter()
        search = ProductSearch(products)
        indexed = time.perf_counter() - start
        goals = generate_goals(products[:queries * 10])["train"][:queries]
        start = time.perf_counter()
        for goal in goals:
            search.search(goal.instruction, k=50)
        per_query = (time.perf_counter() - start) / len(goals)
        rows.append((f"search over {size:,} products", f"{per_query * 1000:,.1f} ms/query",
                     f"generate {generated:.1f} s, index {indexed:.1f} s"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100, help="text-mode episodes per policy")
    parser.add_argument("--sessions", type=int, default=32, help="concurrent server sessions")
    parser.add_argument("--steps-per-session", type=int, default=20)
    parser.add_argument("--browser-steps", type=int, default=30)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()
    rows = [*bench_text(args.episodes), *bench_server(args.sessions, args.steps_per_session),
            *bench_browser(args.browser_steps), *bench_search(args.sizes, args.queries)]
    table = Table(title="WebShop benchmarks")
    for column in ("measurement", "result", "detail"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


if __name__ == "__main__":
    main()
