"""Where games come from: the built-in generated splits (created lazily into a cache) and real ALFWorld data.

Generated split `S` has `per_type` games of each of the six task types; game `i` has task type
`TASK_TYPES[i % 6]` and is generated from (split seed, i) alone, so `reset` on task `i` generates (once, then
reads from the cache) game `i` only. The cache is keyed by generator version, split and seed, and each game is
written with an atomic rename, so concurrent processes can fill it together.

Real data: `$ALFWORLD_DATA/json_2.1.1/<split>/...`, filtered the way ALFWorld's loader filters it (six task
types, no `movable`/`Sliced` paths, `solvable: true`).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from agentgym_opsd.environments.alfworld.generator import (
    GENERATOR_VERSION,
    GameGenerator,
    GeneratedGame,
    Horizon,
    write_game,
)
from agentgym_opsd.environments.alfworld.vocabulary import (
    SCENE_NUMBERS_SEEN,
    SCENE_NUMBERS_UNSEEN,
    TASK_TYPES,
)
from agentgym_opsd.files import atomic_write_text, cache_dir

__all__ = ["SplitConfig", "BUILTIN_SPLITS", "GeneratedSplit", "RealSplit", "GameRef", "cache_root",
           "collect_real_games", "NoGamesError"]


class NoGamesError(FileNotFoundError):
    """A split with no playable games (ALFWorld itself would loop forever on it)."""


@dataclass(frozen=True)
class SplitConfig:
    name: str
    seed: int
    per_type: int
    """Games per task type (the split has 6 x per_type games)."""
    horizon: Horizon
    scene_numbers: tuple[int, ...]

    @property
    def num_games(self) -> int:
        return self.per_type * len(TASK_TYPES)


_STANDARD = Horizon(num_receptacles=(6, 14), num_distractors=(2, 8))
_EASY = Horizon(num_receptacles=(3, 5), num_distractors=(0, 2), allow_closed_start=False, max_plan_length=8)
BUILTIN_SPLITS: dict[str, SplitConfig] = {
    "train": SplitConfig("train", 1000, 80, _STANDARD, SCENE_NUMBERS_SEEN),
    "valid_seen": SplitConfig("valid_seen", 2000, 24, _STANDARD, SCENE_NUMBERS_SEEN),
    "valid_unseen": SplitConfig("valid_unseen", 3000, 24, _STANDARD, SCENE_NUMBERS_UNSEEN),
    "easy": SplitConfig("easy", 4000, 20, _EASY, SCENE_NUMBERS_SEEN),
    "easy_valid": SplitConfig("easy_valid", 5000, 8, _EASY, SCENE_NUMBERS_UNSEEN),
}
"""The built-in splits: train 480, valid_seen 144, valid_unseen 144 (rooms no train game uses), easy 120
(3-5 receptacles, at most 2 distractors, optimal plans of at most 8 steps) and easy_valid 48 (easy games in
the unseen rooms: held-out validation for CPU runs that train on `easy`)."""


@dataclass(frozen=True)
class GameRef:
    """One playable game: its `game.tw-pddl` and what we know of it without loading it."""

    index: int
    task_id: str
    task_type: str
    game_path: Path


def cache_root() -> Path:
    """`$AGENTGYM_OPSD_CACHE/alfworld`, else `~/.cache/agentgym_opsd/alfworld`."""
    return cache_dir("alfworld")


# One generator per process (it holds a planner that takes about a second to set up); the lock also makes
# generation safe when an EnvPool resets environments from several threads.
_GENERATOR_LOCK = threading.Lock()
_GENERATOR: list[GameGenerator] = []


def _generate(config: SplitConfig, index: int) -> GeneratedGame:
    with _GENERATOR_LOCK:
        if not _GENERATOR:
            _GENERATOR.append(GameGenerator())
        return _GENERATOR[0].generate(TASK_TYPES[index % len(TASK_TYPES)], f"{config.name}|{config.seed}|{index}",
                                      config.horizon, scene_numbers=config.scene_numbers,
                                      trial_id=f"T{config.seed}_{index:05d}")


_atomic_write = atomic_write_text  # agentgym_opsd.files


class GeneratedSplit:
    """A built-in split, generated on demand into `root` (default: the cache)."""

    def __init__(self, config: SplitConfig, root: str | os.PathLike[str] | None = None) -> None:
        self.config = config
        self.root = Path(root) if root else cache_root() / f"gen-v{GENERATOR_VERSION}-{config.name}-seed{config.seed}"
        self._refs: dict[int, GameRef] = {}

    def __len__(self) -> int:
        return self.config.num_games

    def task_id(self, index: int) -> str:
        return f"{self.config.name}-{index:05d}"

    def index_of(self, task_id: str) -> int:
        prefix = f"{self.config.name}-"
        digits = task_id.removeprefix(prefix)
        if not task_id.startswith(prefix) or not digits.isdigit() or int(digits) >= len(self):
            raise KeyError(f"unknown task id {task_id!r} for split {self.config.name!r} "
                           f"(expected {prefix}00000 .. {prefix}{len(self) - 1:05d})")
        return int(digits)

    def get(self, index: int) -> GameRef:
        """Game `index`, generated and written to the cache on first use."""
        if not 0 <= index < len(self):
            raise IndexError(f"task index {index} out of range for split {self.config.name!r} ({len(self)} games)")
        if index not in self._refs:
            marker = self.root / "index" / f"{index:05d}.txt"
            path = self.root / marker.read_text(encoding="utf-8").strip() if marker.is_file() else None
            if path is None or not path.is_file():
                game = _generate(self.config, index)
                path = write_game(game, self.root, self.config.name)
                _atomic_write(marker, str(path.relative_to(self.root)))
            self._refs[index] = GameRef(index, self.task_id(index), TASK_TYPES[index % len(TASK_TYPES)], path)
        return self._refs[index]


def collect_real_games(data_root: str | os.PathLike[str], split: str) -> list[Path]:
    """Playable `game.tw-pddl` files of `data_root/json_2.1.1/<split>`, sorted, filtered like ALFWorld's
    loader. Raises NoGamesError when there are none."""
    folder = Path(data_root) / "json_2.1.1" / split
    games = []
    for traj_path in sorted(folder.rglob("traj_data.json")):
        game_path = traj_path.with_name("game.tw-pddl")
        if "movable" in str(traj_path.parent) or "Sliced" in str(traj_path.parent) or not game_path.is_file():
            continue
        with open(traj_path, encoding="utf-8") as handle:
            if json.load(handle).get("task_type") not in TASK_TYPES:
                continue
        with open(game_path, encoding="utf-8") as handle:
            if json.load(handle).get("solvable") is not True:
                continue
        games.append(game_path)
    if not games:
        raise NoGamesError(f"no playable ALFWorld games in {folder} (expected json_2.1.1/{split}/<task folder>/"
                           "trial_*/ with traj_data.json and a solvable game.tw-pddl); check ALFWORLD_DATA and split")
    return games


class RealSplit:
    """Downloaded ALFWorld data (or any folder in its layout)."""

    def __init__(self, data_root: str | os.PathLike[str], split: str) -> None:
        self.root = Path(data_root)
        self.split = split
        self._games = collect_real_games(self.root, split)
        self._ids = {self.task_id(i): i for i in range(len(self._games))}

    def __len__(self) -> int:
        return len(self._games)

    def task_id(self, index: int) -> str:
        return str(self._games[index].parent.relative_to(self.root / "json_2.1.1"))

    def index_of(self, task_id: str) -> int:
        if task_id not in self._ids:
            raise KeyError(f"unknown task id {task_id!r} in {self.root} (ids look like {self.task_id(0)!r})")
        return self._ids[task_id]

    def get(self, index: int) -> GameRef:
        if not 0 <= index < len(self):
            raise IndexError(f"task index {index} out of range for {self.root}/{self.split} ({len(self)} games)")
        path = self._games[index]
        task_type = path.parent.parent.name.split("-", 1)[0]
        return GameRef(index, self.task_id(index), task_type, path)
