"""`ALFWorld-v0`: ALFWorld's text games behind the turn API.

Observations, admissible commands and "Nothing happens." are ALFWorld's own (TextWorld's PDDL engine). Reward: 1.0
on the step where the goal first holds, else 0.0 (the trainer subtracts the invalid-action penalty itself). An
action is valid when, stripped, it is an admissible command; anything else gets "Nothing happens." and leaves the
state unchanged, as the engine would. `lowercase_actions=True` lower-cases the action first, as the released
AgentOPSD / verl-agent trainer does; the default matches exactly. `info["oracle_distance"]` (reset and every
step): the length of the planner's shortest plan from the current state, 0 once the goal holds, None if no plan
exists; the plan is popped while the agent follows it and replanned (`PLAN_CACHE`) when it leaves it.
`info["privileged_hints"]` (reset), for the self-teacher only: `goal`, facts read off the expert's shortest plan
(where each goal object is, what heats / cools / cleans it or which lamp to use, where it goes); `plan`, that plan.
"""

from __future__ import annotations

import os
import re
from typing import Any

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
from agentgym_opsd.environments.alfworld.engine import NOTHING_HAPPENS, AlfredEngine
from agentgym_opsd.environments.alfworld.planner import PLAN_CACHE
from agentgym_opsd.environments.alfworld.splits import BUILTIN_SPLITS, GameRef, GeneratedSplit, RealSplit

__all__ = ["ALFWorldEnv", "DATA_ENV_VAR", "ORACLE_DISTANCE"]

DATA_ENV_VAR = "ALFWORLD_DATA"
"""Folder of downloaded ALFWorld data (holding `json_2.1.1/`), used when `data_source="real"`."""

_TASK_LINE = re.compile(r"Your task is to: (.*?)\.?\s*$", re.MULTILINE)
# ALFWorld 0.4 commands that reveal where things are (the rest, go to / open / examine, only move the agent).
_HINT_FACTS = (
    (re.compile(r"^take (.+) from (.+)$"), "{0} is in/on {1}."),
    (re.compile(r"^(heat|cool|clean) (.+) with (.+)$"), "{0} {1} with {2}."),
    (re.compile(r"^use (.+)$"), "{0} is the lamp to use."),
    (re.compile(r"^(?:move|put) (.+) (?:to|in/on|in|on) (.+)$"), "the target for {0} is {1}."),
)


def privileged_hints(plan: list[str]) -> dict[str, str]:
    """The hint levels of a task from the expert's plan at the start (see the module docstring)."""
    facts = []
    for action in plan:
        for pattern, template in _HINT_FACTS:
            if m := pattern.match(action.strip()):
                fact = template.format(*m.groups())
                facts.append(fact[0].upper() + fact[1:])
                break
    return {"goal": " ".join(facts), "plan": "A shortest plan: " + "; ".join(plan) + "." if plan else ""}


class ALFWorldEnv(TextEnv):
    """One ALFWorld game per episode.

    Args:
        split: `train`, `valid_seen`, `valid_unseen`, `easy` or `easy_valid` (generated); for real data any folder name
            under `json_2.1.1/`.
        data_source: `generated` (built-in splits, made on first use) or `real` (`data_root`, else
            `$ALFWORLD_DATA`).
        data_root: for generated data, where the split is cached (default: the cache dir); for real data,
            the ALFWorld data folder.
        max_turns: turn limit of an episode (truncation).
    """

    def __init__(self, *, split: str = "train", data_source: str = "generated",
                 data_root: str | os.PathLike[str] | None = None, max_turns: int = 50,
                 render_mode: str | None = None, lowercase_actions: bool = False) -> None:
        super().__init__(max_turns=max_turns, render_mode=render_mode)
        self.lowercase_actions = lowercase_actions
        if data_source == "generated":
            if split not in BUILTIN_SPLITS:
                raise ValueError(f"unknown generated split {split!r}; expected one of {sorted(BUILTIN_SPLITS)}")
            self.games: GeneratedSplit | RealSplit = GeneratedSplit(BUILTIN_SPLITS[split], data_root)
        elif data_source == "real":
            root = data_root or os.environ.get(DATA_ENV_VAR)
            if not root:
                raise ValueError(f"data_source='real' needs data_root= or ${DATA_ENV_VAR} (a folder with json_2.1.1/)")
            self.games = RealSplit(root, split)
        else:
            raise ValueError(f"data_source must be 'generated' or 'real', got {data_source!r}")
        self.split = split
        self.data_source = data_source
        self._engine: AlfredEngine | None = None
        self._loaded_path: str | None = None
        self._admissible: list[str] = []
        self._plan: list[str] | None = None
        self._game: GameRef | None = None

    @property
    def num_tasks(self) -> int:
        return len(self.games)

    @property
    def engine(self) -> AlfredEngine:
        if self._engine is None:
            self._engine = AlfredEngine()
        return self._engine

    def _choose_index(self, options: dict[str, Any]) -> int:
        if options.get("task_id") is not None:
            return self.games.index_of(str(options["task_id"]))
        if options.get("task_index") is not None:
            index = int(options["task_index"])
            if not 0 <= index < self.num_tasks:  # the other environments refuse it too; wrapping hid bugs
                raise ValueError(f"task_index must be in [0, {self.num_tasks}), got {index}")
            return index
        return int(self.np_random.integers(self.num_tasks))

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        game = self.games.get(self._choose_index(options))
        if self._loaded_path != str(game.game_path):  # G copies of a task reset the same game: load it once
            self.engine.load(game.game_path)
            self._loaded_path = str(game.game_path)
        self._game = game
        state = self.engine.reset()
        self._admissible = state.admissible_commands
        # A generated game stores the planner's plan from this very state: no need to replan (and translate the
        # problem for the planner) unless the agent leaves it. Real data has no walkthrough: plan now.
        walkthrough = self.engine.walkthrough if self.data_source == "generated" else None
        self._plan = list(walkthrough) if walkthrough is not None else self._replan()
        match = _TASK_LINE.search(state.observation)
        info = {
            TASK_ID: game.task_id, TASK_TYPE: game.task_type, TASK_TEXT: match.group(1) if match else "",
            ADMISSIBLE_ACTIONS: list(self._admissible), WON: state.won,
            "optimal_plan_length": len(self._plan), "game_path": str(game.game_path), "task_index": game.index,
            "split": self.split, "data_source": self.data_source, ORACLE_DISTANCE: self._distance(state.won),
            PRIVILEGED_HINTS: privileged_hints(self._plan),
        }
        return state.observation, info

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        command = action.strip().lower() if self.lowercase_actions else action.strip()
        if command not in self._admissible:
            # The engine would answer the same and leave the state unchanged; skipping it saves ~15 ms and keeps
            # arbitrary text (control characters, 10k-character strings) away from the engine.
            return NOTHING_HAPPENS, 0.0, False, {ACTION_VALID: False, ADMISSIBLE_ACTIONS: list(self._admissible),
                                                 ORACLE_DISTANCE: self._distance(self._won)}
        state = self.engine.step(command)
        self._admissible = state.admissible_commands
        if self._plan and self._plan[0] == command:
            self._plan.pop(0)  # still on the expert's path: the rest of a shortest plan is a shortest plan
        else:
            # Deviated: replan now (not when the oracle is next asked), since the distance is reported every step.
            self._plan = [] if state.won else self._replan()
        reward = 1.0 if state.won and not self._won else 0.0
        return state.observation, reward, state.won, {ACTION_VALID: True, WON: state.won, SCORE: float(state.won),
                                                       ADMISSIBLE_ACTIONS: list(self._admissible),
                                                       ORACLE_DISTANCE: self._distance(state.won)}

    def _replan(self) -> list[str]:
        """A shortest plan from the current state, memoised per (game, state facts)."""
        # The engine exposes no public view of its state; the facts are what identifies a state.
        facts = self.engine._state.facts  # noqa: SLF001
        return PLAN_CACHE.plan(str(self._loaded_path), facts, self.engine.plan)

    def _distance(self, won: bool) -> int | None:
        if won:
            return 0
        return len(self._plan) if self._plan else None  # no plan from a state where the goal does not hold

    def oracle_action(self) -> str:
        if self.episode_ended or self._game is None:
            raise EpisodeEndedError("the episode is over; call reset() first")
        if not self._plan:
            self._plan = self._replan()
        if not self._plan:
            raise RuntimeError(f"the planner found no plan from the current state of {self._game.game_path}")
        return self._plan[0]

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None
            self._loaded_path = None
        super().close()
