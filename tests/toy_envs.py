"""Small real text environments used by the foundation tests (registered on demand, not shipped)."""

from __future__ import annotations

import time
from typing import Any

from agentgym_opsd.core import EpisodeEndedError, TextEnv
from agentgym_opsd.registry import EnvProfile, register_env

__all__ = ["CounterEnv", "FlakyEnv", "register_toy_envs"]


class CounterEnv(TextEnv):
    """Reach a target number from 0 with `inc` / `dec`. Task i has target (i % 5) + 1."""

    def __init__(self, *, max_turns: int = 10, num_targets: int = 5, split: str = "train") -> None:
        super().__init__(max_turns=max_turns)
        self.num_targets = num_targets
        self.split = split
        self.value = 0
        self.target = 1

    @property
    def num_tasks(self) -> int:
        return self.num_targets

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = int(options.get("task_index", self.np_random.integers(self.num_targets)))
        self.target, self.value = index % self.num_targets + 1, 0
        return "The counter shows 0.", {
            "task_id": f"counter-{self.target}",
            "task_type": "up" if self.target % 2 else "even",
            "task_text": f"make the counter show {self.target}",
            "admissible_actions": ["inc", "dec"],
            "optimal_plan_length": self.target,
        }

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        valid = action in ("inc", "dec")
        if valid:
            self.value += 1 if action == "inc" else -1
        won = self.value == self.target
        obs = f"The counter shows {self.value}." if valid else "Nothing happens."
        return obs, float(won), won, {"action_valid": valid, "won": won, "score": float(won),
                                      "admissible_actions": ["inc", "dec"]}

    def oracle_action(self) -> str:
        if self.episode_ended:
            raise EpisodeEndedError("episode over")
        return "inc" if self.value < self.target else "dec"


class FlakyEnv(CounterEnv):
    """Raises or hangs on a chosen step of task 0, to test EnvPool fault handling."""

    def __init__(self, *, max_turns: int = 10, fail: str = "raise", fail_at_step: int = 1) -> None:
        super().__init__(max_turns=max_turns)
        self.fail, self.fail_at_step = fail, fail_at_step

    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if self.target == 1 and self.turn + 1 == self.fail_at_step:
            if self.fail == "raise":
                raise RuntimeError("engine crashed")
            time.sleep(5)
        return super()._step_action(action)


def register_toy_envs() -> None:
    profile = EnvProfile(system_prompt="Answer with <action>inc</action> or <action>dec</action>.",
                         history_turns=2, max_turns=10, skill_library="toy", splits=("train", "test"))
    register_env("ToyCounter-v0", f"{__name__}:CounterEnv", profile=profile, override=True)
    register_env("ToyFlaky-v0", f"{__name__}:FlakyEnv", profile=profile, override=True)
