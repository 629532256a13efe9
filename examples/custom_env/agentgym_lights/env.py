"""`Lights-v0`: switch the lights of a house to a goal state.

Each task shows four lights, some on and some off, and asks for two of them in a given state. Actions are
`toggle <light>` and `look`; the episode is won when every named light is as asked. Tasks are a pure
function of (split, task index), so every run, process and machine sees the same task for the same index.
"""

from __future__ import annotations

import random
from typing import Any

from agentgym_opsd.core import EpisodeEndedError, TextEnv

__all__ = ["LIGHTS", "LightsEnv"]

LIGHTS = ("desk lamp", "floor lamp", "kitchen light", "porch light", "bedside lamp", "hall light", "garage light")
TASKS_PER_SPLIT = {"train": 64, "test": 16}


class LightsEnv(TextEnv):
    """The registry passes `max_turns` (from the profile or the trainer's `env.max_turns`) and `split`
    (from an `Lights-v0:split` spec); anything in the trainer's `env.kwargs` arrives here too."""

    def __init__(self, *, max_turns: int = 6, split: str = "train") -> None:
        super().__init__(max_turns=max_turns)
        if split not in TASKS_PER_SPLIT:
            raise ValueError(f"split must be one of {sorted(TASKS_PER_SPLIT)}, got {split!r}")
        self.split = split
        self.state: dict[str, bool] = {}
        self.goal: dict[str, bool] = {}

    @property
    def num_tasks(self) -> int:
        return TASKS_PER_SPLIT[self.split]

    def _task(self, index: int) -> tuple[dict[str, bool], dict[str, bool]]:
        rng = random.Random(f"{self.split}:{index}")  # str seeds are hashed stably across processes
        lights = rng.sample(LIGHTS, 4)
        state = {name: rng.random() < 0.5 for name in lights}
        goal = {name: not state[name] for name in rng.sample(lights, 2)}
        return state, goal

    def _describe(self) -> str:
        return "; ".join(f"the {name} is {'on' if on else 'off'}" for name, on in self.state.items()).capitalize() + "."

    def _admissible(self) -> list[str]:
        return ["look", *(f"toggle {name}" for name in self.state)]

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if options.get("task_index") is not None:
            index = int(options["task_index"])
            if not 0 <= index < self.num_tasks:
                raise ValueError(f"task_index must be in [0, {self.num_tasks}), got {index}")
        else:
            index = int(self.np_random.integers(self.num_tasks))
        self.state, self.goal = self._task(index)
        wanted = " and ".join(f"turn {'on' if on else 'off'} the {name}" for name, on in self.goal.items())
        kinds = set(self.goal.values())
        task_type = "mixed" if len(kinds) == 2 else ("switch_on" if True in kinds else "switch_off")
        return f"{self._describe()} Your task is to: {wanted}.", {
            "task_id": f"lights-{self.split}-{index}",
            "task_type": task_type,
            "task_text": wanted,
            "admissible_actions": self._admissible(),
            "optimal_plan_length": len(self.goal),
        }

    def _goal_reached(self) -> bool:
        return all(self.state[name] == on for name, on in self.goal.items())

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        action = action.strip().lower()
        name = action.removeprefix("toggle ").strip() if action.startswith("toggle ") else None
        if action == "look":
            observation, valid = self._describe(), True
        elif name in self.state:
            self.state[name] = not self.state[name]
            observation, valid = f"You toggle the {name}. It is now {'on' if self.state[name] else 'off'}.", True
        else:  # answered, never raised: the trainer counts it as an invalid action
            observation, valid = "Nothing happens. Try 'look' or 'toggle <light>'.", False
        won = self._goal_reached()
        return observation, float(won), won, {"action_valid": valid, "won": won, "score": float(won),
                                              "admissible_actions": self._admissible()}

    def oracle_action(self) -> str:
        if self.episode_ended:
            raise EpisodeEndedError("the episode is over")
        wrong = [name for name, on in self.goal.items() if self.state[name] != on]
        return f"toggle {wrong[0]}" if wrong else "look"
