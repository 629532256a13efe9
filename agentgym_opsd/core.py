"""The turn API: a text `gymnasium.Env` base class and the standard `info` keys.

Observations and actions are strings. `reset(seed=..., options=...)` picks a task deterministically from
the seed (or from `options["task_index"]` / `options["task_id"]`), `step(action)` returns the gymnasium
5-tuple. Malformed actions are answered with an observation and `info["action_valid"] = False`, never
raised. An action that is not a `str` at all (None, a number, bytes, a list, a dict) is the caller's bug, not
the agent's move: `step` raises TypeError naming its type before the turn counts (the action space holds
strings only, and Gymnasium leaves what happens outside it to the environment). Every environment also offers `oracle_action()`: the next action of an expert from the current
state (demonstrations, tests and the oracle policy use it).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Final

import gymnasium as gym

__all__ = [
    "TextEnv",
    "TextSpace",
    "INFO_KEYS",
    "TASK_ID",
    "TASK_TYPE",
    "TASK_TEXT",
    "ADMISSIBLE_ACTIONS",
    "ACTION_VALID",
    "WON",
    "SCORE",
    "MAX_TURNS",
    "ORACLE_DISTANCE",
    "PRIVILEGED_HINTS",
    "EpisodeEndedError",
]

TASK_ID: Final = "task_id"
TASK_TYPE: Final = "task_type"
TASK_TEXT: Final = "task_text"
ADMISSIBLE_ACTIONS: Final = "admissible_actions"
ACTION_VALID: Final = "action_valid"
WON: Final = "won"
SCORE: Final = "score"
MAX_TURNS: Final = "max_turns"
ORACLE_DISTANCE: Final = "oracle_distance"
"""Optional info key: the expert's distance to the goal from the current state (None when unreachable)."""
PRIVILEGED_HINTS: Final = "privileged_hints"
"""Optional info key, on reset: task-specific facts the student never sees, by level (`{"goal": "...",
"plan": "..."}`), for the self-teacher (`teacher.context=hint`). Each environment documents its levels."""

INFO_KEYS: Final = (TASK_ID, TASK_TYPE, TASK_TEXT, ADMISSIBLE_ACTIONS, ACTION_VALID, WON, SCORE, MAX_TURNS)
"""Keys every environment puts in `info` on reset and on every step. `admissible_actions` is None when the
environment cannot enumerate its actions (Search-QA); `score` is partial credit in [0, 1]."""

# Observations and actions are free text; gymnasium's Text space needs a charset and a max length. We accept
# any Unicode text (the env answers unknown characters as an invalid action), so the space is permissive.
_MAX_TEXT = 1_000_000


def _preview(value: Any) -> str:
    """A short repr of a refused action (it may be huge)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class TextSpace(gym.spaces.Text):
    """Any string up to `max_length` characters (gymnasium's `Text` restricted to a charset is too narrow
    for natural language observations and model-written actions)."""

    def __init__(self, max_length: int = _MAX_TEXT) -> None:
        super().__init__(max_length=max_length, min_length=0)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class EpisodeEndedError(RuntimeError):
    """Raised by `oracle_action()` when the episode is over (there is no next expert action)."""


class TextEnv(gym.Env[str, str]):
    """Base class for text environments behind the turn API.

    Subclasses implement `_reset_task` (load the task chosen for this seed, return the first observation and
    the task's info) and `_step_action` (apply one action). The base class keeps the episode bookkeeping
    that every environment needs to get right the same way: the turn counter, actions after the end of the
    episode, the standard info keys.
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"]}  # noqa: RUF012 - gymnasium declares it so

    def __init__(self, *, max_turns: int = 50, render_mode: str | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self._turn = 0
        self._ended = True
        self._last_observation = ""
        self._task_info: dict[str, Any] = {}
        self._won = False
        self._score = 0.0

    # ---- what subclasses implement -------------------------------------------------------------------
    @abstractmethod
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Start the task chosen by `self.np_random` / `options`; return (observation, task info) where the
        task info holds at least task_id, task_type, task_text and admissible_actions."""

    @abstractmethod
    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply `action`; return (observation, reward, terminated, info) with at least action_valid, won,
        score and admissible_actions in info."""

    @abstractmethod
    def oracle_action(self) -> str:
        """The expert's next action from the current state (raise EpisodeEndedError after the end)."""

    @property
    @abstractmethod
    def num_tasks(self) -> int:
        """How many distinct tasks `reset` can choose from."""

    # ---- gymnasium API ---------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        observation, task_info = self._reset_task(dict(options or {}))
        self._turn = 0
        self._ended = False
        self._won = bool(task_info.pop(WON, False))
        self._score = float(task_info.pop(SCORE, 0.0))
        self._task_info = {
            TASK_ID: task_info.get(TASK_ID, ""),
            TASK_TYPE: task_info.get(TASK_TYPE, ""),
            TASK_TEXT: task_info.get(TASK_TEXT, ""),
        }
        self._last_observation = observation
        info = {**task_info, **self._task_info, ACTION_VALID: True, WON: self._won, SCORE: self._score,
                MAX_TURNS: self.max_turns}
        info.setdefault(ADMISSIBLE_ACTIONS, None)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):  # before anything changes: the episode goes on after the caller's fix
            raise TypeError(f"{type(self).__name__}.step: the action must be a str (the text the agent "
                            f"played), got {type(action).__name__} {_preview(action)}")
        if self._ended:
            # Gymnasium leaves this undefined; an agent loop that keeps talking must get an answer, not a crash.
            info = {**self._task_info, ADMISSIBLE_ACTIONS: [], ACTION_VALID: False, WON: self._won,
                    SCORE: self._score, MAX_TURNS: self.max_turns}
            return "The episode has ended. Call reset() to start a new one.", 0.0, True, False, info
        observation, reward, terminated, step_info = self._step_action(action)
        self._turn += 1
        self._won = bool(step_info.pop(WON, self._won))
        self._score = float(step_info.pop(SCORE, self._score))
        truncated = not terminated and self._turn >= self.max_turns
        self._ended = terminated or truncated
        self._last_observation = observation
        info = {**step_info, **self._task_info, WON: self._won, SCORE: self._score, MAX_TURNS: self.max_turns}
        info.setdefault(ACTION_VALID, True)
        info.setdefault(ADMISSIBLE_ACTIONS, None)
        return observation, float(reward), bool(terminated), bool(truncated), info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_observation
        return None

    @property
    def turn(self) -> int:
        """Turns taken in the current episode."""
        return self._turn

    @property
    def episode_ended(self) -> bool:
        return self._ended
