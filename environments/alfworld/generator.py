"""Generates ALFWorld games: a room layout, target and distractor objects, a goal sentence from ALFWorld's
templates, then a planner check that the game is solvable (its plan is the walkthrough).

Everything is deterministic in (task type, seed, horizon, scene pool): the same arguments give the same
game, byte for byte, in any process. The layout (which receptacles stand where) depends only on the room
kind, the scene number and the receptacle count, so a split that draws from other scene numbers never
shows a layout of another split.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.alfworld.assets import (
    GOAL_PLACEHOLDER,
    alfred_tables,
    domain_text,
    goal_templates,
    grammar_text,
)
from agentgym_opsd.environments.alfworld.names import location_id, position_id, sink_id
from agentgym_opsd.environments.alfworld.planner import PlanChecker
from agentgym_opsd.environments.alfworld.problem import GameSpec, PortableObject, Receptacle, problem_text
from agentgym_opsd.environments.alfworld.vocabulary import (
    LAMP_HOLDERS,
    LAMPS,
    REQUIRED_RECEPTACLE,
    ROOM_KINDS,
    SCENE_NUMBERS_SEEN,
    TASK_ROOMS,
    TASK_TYPES,
)
from agentgym_opsd.files import make_tmp_dir, publish_dir, to_json

__all__ = ["GENERATOR_VERSION", "Horizon", "GeneratedGame", "GameGenerator", "GenerationError", "write_game"]

GENERATOR_VERSION = 1
"""Bump when generated games change (cache keys include it)."""

_MAX_ATTEMPTS = 50


class GenerationError(RuntimeError):
    """No valid game found for the arguments (e.g. a horizon too small for the task type)."""


@dataclass(frozen=True)
class Horizon:
    """How long a game is: ranges are inclusive (low, high)."""

    num_receptacles: tuple[int, int] = (6, 12)
    num_distractors: tuple[int, int] = (2, 6)
    allow_closed_start: bool = True
    """Whether target objects may start inside openable receptacles (adds an `open` step)."""
    max_plan_length: int | None = None
    """Reject games whose optimal plan is longer (None: no cap)."""

    def __post_init__(self) -> None:
        for name in ("num_receptacles", "num_distractors"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"Horizon.{name} must be (low, high) with 0 <= low <= high, got {(low, high)}")
        if self.num_receptacles[0] < 2:
            raise ValueError("Horizon.num_receptacles must allow at least 2 receptacles (start and goal)")


@dataclass(frozen=True)
class GeneratedGame:
    spec: GameSpec
    problem: str
    walkthrough: tuple[str, ...]
    """The planner's plan from the initial state (player commands)."""

    @property
    def optimal_plan_length(self) -> int:
        return len(self.walkthrough)

    def game_json(self) -> dict[str, Any]:
        """`game.tw-pddl`: ALFWorld's four keys plus our walkthrough."""
        grammar = grammar_text().replace(GOAL_PLACEHOLDER, self.spec.goal_sentence)
        return {"pddl_domain": domain_text(), "grammar": grammar, "pddl_problem": self.problem, "solvable": True,
                "walkthrough": list(self.walkthrough)}

    def traj_data(self) -> dict[str, Any]:
        """`traj_data.json` with the keys ALFWorld reads, plus an `agentgym` block of our metadata."""
        spec = self.spec
        return {
            "task_id": spec.trial_id,
            "task_type": spec.task_type,
            "scene": {"scene_num": spec.scene_number, "room_type": spec.room},
            "pddl_params": {"object_sliced": False, "object_target": spec.object_target,
                            "parent_target": spec.parent_target, "toggle_target": spec.toggle_target,
                            "mrecep_target": ""},
            "turk_annotations": {"anns": [{"task_desc": spec.goal_sentence[0].upper() + spec.goal_sentence[1:] + "."}]},
            "agentgym": {"generator_version": GENERATOR_VERSION, "goal": spec.goal_sentence,
                         "optimal_plan_length": self.optimal_plan_length, "walkthrough": list(self.walkthrough),
                         "num_receptacles": len(spec.receptacles), "num_distractors": spec.num_distractors,
                         "num_objects": len(spec.objects)},
        }


def _unique_xyz(rng: random.Random, used: set[tuple[float, float, float]]) -> tuple[float, float, float]:
    while True:
        xyz = (round(rng.uniform(-4, 4), 2), round(rng.uniform(0, 2), 2), round(rng.uniform(-4, 4), 2))
        if xyz not in used:
            used.add(xyz)
            return xyz


def _unique_location(rng: random.Random, used: set[str]) -> str:
    while True:
        loc = location_id(rng.randint(-15, 15), rng.randint(-15, 15), rng.randint(0, 3), rng.choice((0, 15, 30, 45, 60)))
        if loc not in used:
            used.add(loc)
            return loc


def _make_receptacle(cls: str, rng: random.Random, xyzs: set, locs: set) -> Receptacle:
    xyz = _unique_xyz(rng, xyzs)
    pddl_id = sink_id(cls, xyz) if cls.endswith("Basin") else position_id(cls, xyz)
    return Receptacle(pddl_id, cls, _unique_location(rng, locs))


def layout(room: str, scene: int, num_receptacles: int, required: tuple[str, ...] = ()) -> list[Receptacle]:
    """The receptacles of scene `scene` of a room kind: deterministic in (room, scene, count); `required`
    classes replace the last drawn ones when missing."""
    kind = ROOM_KINDS[room]
    rng = random.Random(f"layout|{room}|{scene}|{num_receptacles}")
    pool = list(kind.receptacles)
    rng.shuffle(pool)
    classes = pool[:min(num_receptacles, len(pool))]
    for cls in required:
        if cls not in classes:
            replace = max(i for i, c in enumerate(classes) if c not in required)
            classes[replace] = cls
    xyzs: set = set()
    locs: set[str] = set()
    return [_make_receptacle(cls, rng, xyzs, locs) for cls in classes]


class GameGenerator:
    """Samples and checks games. Holds one planner (about a second to set up); not thread-safe."""

    def __init__(self) -> None:
        self._checker = PlanChecker()
        self._tables = alfred_tables()

    def generate(self, task_type: str, seed: int | str, horizon: Horizon = Horizon(), *,
                 scene_numbers: tuple[int, ...] = SCENE_NUMBERS_SEEN, trial_id: str | None = None) -> GeneratedGame:
        """One solvable game of `task_type`; retries other draws of the same seed until one is valid.
        `trial_id` names the game folder (default: derived from the seed, stable across processes)."""
        if task_type not in TASK_TYPES:
            raise ValueError(f"unknown task type {task_type!r}; expected one of {TASK_TYPES}")
        trial_id = trial_id or f"T{zlib.crc32(f'{task_type}|{seed}'.encode()):010d}"
        for attempt in range(_MAX_ATTEMPTS):
            rng = random.Random(f"game|{task_type}|{seed}|{attempt}")
            spec = self._sample(task_type, rng, horizon, scene_numbers, trial_id)
            if spec is None:
                continue
            problem = problem_text(spec)
            result = self._checker.check(problem)
            if not result.solvable or result.won_at_start:
                continue
            if horizon.max_plan_length is not None and len(result.plan) > horizon.max_plan_length:
                continue
            return GeneratedGame(spec, problem, result.plan)
        raise GenerationError(f"no valid {task_type} game in {_MAX_ATTEMPTS} draws for seed {seed!r} and {horizon}")

    # ---- sampling ----------------------------------------------------------------------------------------
    def _sample(self, task_type: str, rng: random.Random, horizon: Horizon, scene_numbers: tuple[int, ...],
                trial_id: str) -> GameSpec | None:
        tables = self._tables
        room = rng.choice(TASK_ROOMS[task_type])
        kind = ROOM_KINDS[room]
        scene = rng.choice(scene_numbers)
        appliance = REQUIRED_RECEPTACLE.get(task_type)
        look_at = task_type == "look_at_obj_in_light"
        required: tuple[str, ...] = (appliance,) if appliance else ()
        if look_at:
            required = (rng.choice([c for c in LAMP_HOLDERS if c in kind.receptacles]),)
        receptacles = layout(room, scene, rng.randint(*horizon.num_receptacles), required)
        present = {r.cls for r in receptacles}

        def starts_for(obj: str, parent: str) -> list[Receptacle]:
            # ALFRED's sampling rules: the target starts neither in the goal's receptacle class nor in the
            # appliance the task needs.
            starts = [r for r in receptacles if r.cls not in (parent, appliance) and tables.can_contain(r.cls, obj)]
            if not horizon.allow_closed_start:
                starts = [r for r in starts if r.cls not in tables.openable]
            return starts

        state_classes = {"pick_clean_then_place_in_recep": tables.cleanable,
                         "pick_heat_then_place_in_recep": tables.heatable,
                         "pick_cool_then_place_in_recep": tables.coolable}.get(task_type)
        options = []
        for obj in kind.objects:
            if state_classes is not None and obj not in state_classes:
                continue
            if obj in tables.movable_receptacles and task_type != "pick_and_place_simple":
                continue  # keep targets simple objects; movable receptacles appear as distractors
            parents = [""] if look_at else sorted(p for p in present if p != appliance and tables.can_contain(p, obj))
            options += [(obj, p) for p in parents if starts_for(obj, p)]
        if not options:
            return None
        obj, parent = rng.choice(options)
        starts = starts_for(obj, parent)

        xyzs: set = set()
        objects: list[PortableObject] = []

        def place(cls: str, where: Receptacle) -> None:
            objects.append(PortableObject(position_id(cls, _unique_xyz(rng, xyzs)), cls, where))

        count = 2 if task_type == "pick_two_obj_and_place" else 1
        if horizon.num_distractors[1] > 0 and rng.random() < 0.3:
            count += 1  # sometimes a spare instance of the target class
        for _ in range(count):
            place(obj, rng.choice(starts))
        toggle = ""
        if look_at:
            toggle = rng.choice(LAMPS)
            holder = next(r for r in receptacles if r.cls == required[0])
            place(toggle, holder)
        num_distractors = rng.randint(*horizon.num_distractors)
        distractor_classes = [c for c in kind.objects if c != obj and any(tables.can_contain(r.cls, c) for r in receptacles)]
        for _ in range(num_distractors if distractor_classes else 0):
            cls = rng.choice(distractor_classes)
            place(cls, rng.choice([r for r in receptacles if tables.can_contain(r.cls, cls)]))

        locs = {r.location for r in receptacles}
        agent_location = _unique_location(rng, locs)  # a spot with no receptacle: "in the middle of a room"
        template = rng.choice(goal_templates()[task_type])
        goal = template.format(obj=obj.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
        return GameSpec(trial_id=trial_id, task_type=task_type, room=room, scene_number=kind.scene_base + scene,
                        object_target=obj, parent_target=parent, toggle_target=toggle, goal_sentence=goal,
                        agent_location=agent_location, receptacles=tuple(receptacles), objects=tuple(objects),
                        num_distractors=num_distractors)


_SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def check_split_name(split: str) -> str:
    """`split` if it is a plain folder name (letters, digits, `_.-`; no `/`, no `..`), else ValueError:
    `--split ../../x` must not write outside the data root."""
    if not _SPLIT_NAME.fullmatch(split) or ".." in split:
        raise ValueError(f"split must be a plain name (letters, digits, '_', '.', '-'; no path), got {split!r}")
    return split


def write_game(game: GeneratedGame, data_root: str | os.PathLike[str], split: str) -> Path:
    """Write `data_root/json_2.1.1/<split>/<folder>/trial_<id>/{traj_data.json, game.tw-pddl}` atomically
    (a temporary folder renamed into place, so a concurrent reader never sees half a game). Returns the
    path of `game.tw-pddl`; an existing identical game is kept. `split` is a folder name, never a path."""
    check_split_name(split)
    parent = Path(data_root) / "json_2.1.1" / split / game.spec.folder_name
    final = parent / f"trial_{game.spec.trial_id}"
    if (final / "game.tw-pddl").is_file():
        return final / "game.tw-pddl"
    staging = make_tmp_dir(final)  # removes the leftovers of writers that were killed mid-way
    try:
        (staging / "traj_data.json").write_text(to_json(game.traj_data(), indent=1), encoding="utf-8")
        (staging / "game.tw-pddl").write_text(to_json(game.game_json()), encoding="utf-8")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # another process may have written the same game meanwhile: theirs is as good
    publish_dir(staging, final, keep=lambda trial: (trial / "game.tw-pddl").is_file())
    return final / "game.tw-pddl"
