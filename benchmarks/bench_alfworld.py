"""ALFWorld-v0 against raw TextWorld `PddlEnv` on the same games, and the generator's throughput.

    python benchmarks/bench_alfworld.py [--games 8] [--pool 16] [--repeats 3] [--fast-repeats 15]

Every side plays each game's expert walkthrough plus one invalid command, and steps and resets are timed
apart: steps/s counts commands over the time spent in `step` only; resets/s counts game loads + resets over
the time spent in them. Each repeat starts with no compiled game in memory, so a game's first load pays for
its translation, as in a fresh training process.

Sides: raw `PddlEnv` (TextWorld, given ALFWorld's names, as ALFWorld plays it), `AlfredEngine` (our engine
alone) and ALFWorld-v0 (the engine behind the turn API). Settings: one environment playing the games in
turn; a pool of `--pool` environments in threads, environment k on game k % games (the G copies of a task
in a GRPO batch), reset and stepped together each turn, as EnvPool does. Each repeat runs the sides in a
rotating order, so that load from other processes falls on all of them; the table shows medians (raw is
~50x slower, so it runs fewer repeats, each ~50x longer).
Overhead = 1 - ALFWorld-v0 / raw (negative: faster than raw); wrapper = 1 - ALFWorld-v0 / AlfredEngine.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from agentgym_opsd.environments.alfworld.engine import PARSE_LOCK, AlfredEngine, clear_compiled_games
from agentgym_opsd.environments.alfworld.env import ALFWorldEnv
from agentgym_opsd.environments.alfworld.names import display_names

INVALID = "dance"


@dataclass
class Game:
    index: int
    path: str
    commands: list[str]
    """The walkthrough, then one invalid command."""


@dataclass
class Timing:
    steps: int = 0
    seconds_steps: float = 0.0
    resets: int = 0
    seconds_resets: float = 0.0

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds_steps

    @property
    def resets_per_s(self) -> float:
        return self.resets / self.seconds_resets


class RawPlayer:
    """TextWorld's PddlEnv with ALFWorld's names. Its grammar parser is not thread-safe: raw threads need the
    same lock ALFWorld-v0 takes."""

    def __init__(self) -> None:
        import textworld
        from textworld.envs.pddl.pddl import PddlEnv

        self.env = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))

    def reset(self, game: Game) -> None:
        with PARSE_LOCK:
            self.env.load(game.path)
            for pddl_id, name in display_names(self.env._entity_infos).items():
                self.env._entity_infos[pddl_id].name = name
            self.env.reset()

    def step(self, command: str) -> None:
        with PARSE_LOCK:
            self.env.step(command)


class EnginePlayer:
    def __init__(self) -> None:
        self.engine = AlfredEngine()

    def reset(self, game: Game) -> None:
        self.engine.load(game.path)
        self.engine.reset()

    def step(self, command: str) -> None:
        self.engine.step(command)


class OurPlayer:
    def __init__(self, split: str) -> None:
        self.env = ALFWorldEnv(split=split)
        self.env.engine  # noqa: B018 (made on first use: load its planner library now, as raw does in __init__)

    def reset(self, game: Game) -> None:
        self.env.reset(options={"task_index": game.index})

    def step(self, command: str) -> None:
        self.env.step(command)


def play_single(player: Any, games: list[Game]) -> Timing:
    timing = Timing()
    for game in games:
        start = time.perf_counter()
        player.reset(game)
        timing.seconds_resets += time.perf_counter() - start
        timing.resets += 1
        for command in game.commands:
            start = time.perf_counter()
            player.step(command)
            timing.seconds_steps += time.perf_counter() - start
            timing.steps += 1
    return timing


def play_pool(players: list[Any], games: list[Game], executor: cf.ThreadPoolExecutor) -> Timing:
    timing = Timing()
    assigned = [games[k % len(games)] for k in range(len(players))]
    start = time.perf_counter()
    list(executor.map(lambda k: players[k].reset(assigned[k]), range(len(players))))
    timing.seconds_resets, timing.resets = time.perf_counter() - start, len(players)
    for turn in range(max(len(game.commands) for game in assigned)):
        active = [k for k in range(len(players)) if turn < len(assigned[k].commands)]
        start = time.perf_counter()
        list(executor.map(lambda k, t=turn: players[k].step(assigned[k].commands[t]), active))
        timing.seconds_steps += time.perf_counter() - start
        timing.steps += len(active)
    return timing


SIDES: dict[str, Callable[[str], Any]] = {
    "raw": lambda split: RawPlayer(),
    "engine": lambda split: EnginePlayer(),
    "ours": OurPlayer,
}


def measure(games: list[Game], split: str, pool: int, repeats: int,
            fast_repeats: int) -> dict[str, dict[str, list[Timing]]]:
    """setting -> side -> one Timing per repeat; sides run in a rotating order within each repeat. Raw runs
    `repeats` times; ours and the engine, ~50x faster (so a repeat lasts ~0.1 s, short enough for other load
    to show), `fast_repeats` times."""
    results: dict[str, dict[str, list[Timing]]] = {"single": {s: [] for s in SIDES}, "pool": {s: [] for s in SIDES}}
    with cf.ThreadPoolExecutor(max_workers=pool) as executor:
        for repeat in range(max(repeats, fast_repeats)):
            names = [s for s in SIDES if repeat < (repeats if s == "raw" else fast_repeats)]
            for side in names[repeat % len(names):] + names[:repeat % len(names)]:
                clear_compiled_games()
                results["single"][side].append(play_single(SIDES[side](split), games))
                clear_compiled_games()
                players = [SIDES[side](split) for _ in range(pool)]
                results["pool"][side].append(play_pool(players, games, executor))
    return results


def median(timings: list[Timing], rate: str) -> float:
    return statistics.median(getattr(t, rate) for t in timings)


def env_table(results: dict[str, dict[str, list[Timing]]], title: str, pool: int) -> Table:
    table = Table(title=title)
    for col in ("setting", "raw steps/s", "AlfredEngine steps/s", "ALFWorld-v0 steps/s", "overhead vs raw",
                "wrapper overhead", "raw resets/s", "ALFWorld-v0 resets/s"):
        table.add_column(col, justify="right")
    for setting, label in (("single", "single env"), ("pool", f"pool of {pool} (threads)")):
        side = results[setting]
        raw, engine, ours = (median(side[s], "steps_per_s") for s in ("raw", "engine", "ours"))
        raw_resets, our_resets = (median(side[s], "resets_per_s") for s in ("raw", "ours"))
        table.add_row(label, f"{raw:.1f}", f"{engine:.1f}", f"{ours:.1f}",
                      f"{1 - ours / raw:+.0%} ({ours / raw:.0f}x raw)", f"{1 - ours / engine:+.1%}",
                      f"{raw_resets:.2f}", f"{our_resets:.2f} ({our_resets / raw_resets:.0f}x raw)")
    return table


def generator_table(num_games: int) -> Table:
    from agentgym_opsd.environments.alfworld.generator import GameGenerator
    from agentgym_opsd.environments.alfworld.splits import BUILTIN_SPLITS
    from agentgym_opsd.environments.alfworld.vocabulary import TASK_TYPES

    table = Table(title="Game generator (sampling + planner solvability check)")
    for col in ("horizon", "games", "seconds", "games/s", "mean optimal plan"):
        table.add_column(col, justify="right")
    generator = GameGenerator()
    for name in ("easy", "train"):
        start = time.perf_counter()
        made = [generator.generate(TASK_TYPES[i % 6], f"bench|{i}", BUILTIN_SPLITS[name].horizon)
                for i in range(num_games)]
        seconds = time.perf_counter() - start
        mean_plan = sum(g.optimal_plan_length for g in made) / len(made)
        table.add_row(name, str(len(made)), f"{seconds:.2f}", f"{len(made) / seconds:.1f}", f"{mean_plan:.1f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=8, help="games per measurement")
    parser.add_argument("--pool", type=int, default=16, help="environments in the pool")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of raw PddlEnv per setting (median shown)")
    parser.add_argument("--fast-repeats", type=int, default=15,
                        help="repeats of AlfredEngine and ALFWorld-v0 per setting (median shown)")
    parser.add_argument("--split", default="valid_seen")
    parser.add_argument("--gen-games", type=int, default=12, help="games generated for the throughput rows")
    args = parser.parse_args()
    os.environ.setdefault("AGENTGYM_OPSD_CACHE", tempfile.mkdtemp(prefix="bench-alfworld-"))

    env = ALFWorldEnv(split=args.split)  # generate the games first: not part of the env timing
    games = []
    for index in range(args.games):
        path = str(env.games.get(index).game_path)
        with open(path, encoding="utf-8") as handle:
            games.append(Game(index, path, [*json.load(handle)["walkthrough"], INVALID]))
    results = measure(games, args.split, args.pool, args.repeats, args.fast_repeats)

    console = Console(width=200)
    title = (f"ALFWorld-v0 vs raw PddlEnv ({args.games} games of {args.split}, walkthrough + 1 invalid; "
             f"median of {args.repeats} raw / {args.fast_repeats} other repeats; steps exclude resets)")
    console.print(env_table(results, title, args.pool))
    console.print(generator_table(args.gen_games))


if __name__ == "__main__":
    main()
