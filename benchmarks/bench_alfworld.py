"""ALFWorld-v0 against raw TextWorld `PddlEnv` on the same games, and the generator's throughput.

    python benchmarks/bench_alfworld.py [--games 12] [--pool 16]

Each side plays every game's expert walkthrough from reset (loading the game included) plus one invalid
command per game; steps/s = commands / wall time. "pool" runs `--pool` environments in threads, one game
each at a time. Overhead = 1 - ours / raw.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import tempfile
import time

from rich.console import Console
from rich.table import Table


def play_raw(paths: list[str]) -> int:
    import textworld
    from textworld.envs.pddl.pddl import PddlEnv

    from agentgym_opsd.environments.alfworld.engine import PARSE_LOCK

    env = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))
    steps = 0
    for path in paths:
        # TextWorld's grammar parser is not thread-safe: raw threads need the same lock ALFWorld-v0 takes.
        with PARSE_LOCK:
            env.load(path)
            env.reset()
        for command in [*json.load(open(path))["walkthrough"], "dance"]:
            with PARSE_LOCK:
                env.step(command)
            steps += 1
    return steps


def play_ours(indices: list[int], split: str) -> int:
    from agentgym_opsd.environments.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split=split)
    steps = 0
    for index in indices:
        _, info = env.reset(options={"task_index": index})
        for command in [*json.load(open(info["game_path"]))["walkthrough"], "dance"]:
            env.step(command)
            steps += 1
    return steps


def timed(fn, *args) -> tuple[int, float]:
    start = time.perf_counter()
    steps = fn(*args)
    return steps, time.perf_counter() - start


def timed_pool(fn, chunks: list, *extra) -> tuple[int, float]:
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=len(chunks)) as pool:
        steps = sum(pool.map(lambda chunk: fn(chunk, *extra), chunks))
    return steps, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=12, help="games per measurement")
    parser.add_argument("--pool", type=int, default=16, help="environments in the pool")
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--gen-games", type=int, default=12, help="games generated for the throughput rows")
    args = parser.parse_args()
    os.environ.setdefault("AGENTGYM_OPSD_CACHE", tempfile.mkdtemp(prefix="bench-alfworld-"))

    from agentgym_opsd.environments.alfworld.generator import GameGenerator
    from agentgym_opsd.environments.alfworld.splits import BUILTIN_SPLITS, GeneratedSplit
    from agentgym_opsd.environments.alfworld.vocabulary import TASK_TYPES

    split = GeneratedSplit(BUILTIN_SPLITS[args.split])
    indices = list(range(args.games))
    paths = [str(split.get(i).game_path) for i in indices]  # generate first: not part of the env timing

    console = Console()
    table = Table(title=f"ALFWorld-v0 vs raw PddlEnv ({args.games} games of {args.split}, walkthrough + 1 invalid)")
    for col in ("setting", "raw steps/s", "ALFWorld-v0 steps/s", "overhead"):
        table.add_column(col, justify="right")
    raw_steps, raw_s = timed(play_raw, paths)
    our_steps, our_s = timed(play_ours, indices, args.split)
    table.add_row("single env", f"{raw_steps / raw_s:.1f}", f"{our_steps / our_s:.1f}",
                  f"{1 - (our_steps / our_s) / (raw_steps / raw_s):+.1%}")
    pool_idx = [indices[i::args.pool] for i in range(args.pool) if indices[i::args.pool]]
    raw_steps, raw_s = timed_pool(play_raw, [[paths[i] for i in chunk] for chunk in pool_idx])
    our_steps, our_s = timed_pool(play_ours, pool_idx, args.split)
    table.add_row(f"pool of {len(pool_idx)} (threads)", f"{raw_steps / raw_s:.1f}", f"{our_steps / our_s:.1f}",
                  f"{1 - (our_steps / our_s) / (raw_steps / raw_s):+.1%}")
    console.print(table)

    gen_table = Table(title="Game generator (sampling + planner solvability check)")
    for col in ("horizon", "games", "seconds", "games/s", "mean optimal plan"):
        gen_table.add_column(col, justify="right")
    generator = GameGenerator()
    for name in ("easy", "train"):
        config = BUILTIN_SPLITS[name]
        start = time.perf_counter()
        games = [generator.generate(TASK_TYPES[i % 6], f"bench|{i}", config.horizon) for i in range(args.gen_games)]
        seconds = time.perf_counter() - start
        mean_plan = sum(g.optimal_plan_length for g in games) / len(games)
        gen_table.add_row(name, str(len(games)), f"{seconds:.2f}", f"{len(games) / seconds:.1f}", f"{mean_plan:.1f}")
    console.print(gen_table)


if __name__ == "__main__":
    main()
