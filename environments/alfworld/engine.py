"""The game engine: TextWorld's PDDL environment playing one ALFWorld `game.tw-pddl`, with ALFWorld's names.

TextWorld's `PddlEnv` gives ALFWorld's text, its admissible commands and "Nothing happens." for anything
else; fast-downward (inside it) replans from any state in about a millisecond, which is our oracle.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentgym_opsd.environments.alfworld.names import display_names

__all__ = ["AlfredEngine", "EngineState", "NOTHING_HAPPENS", "PARSE_LOCK"]

NOTHING_HAPPENS = "Nothing happens."
"""The engine's answer to a command that is not admissible."""

PARSE_LOCK = threading.Lock()
"""TextWorld parses grammar text with one module-level parser, on load and again on every reset/step (each
observation is derived from parsed rules); two threads in it at once crash it ("pop from empty list"). Every
engine call in this package holds this lock, so engines are safe in EnvPool threads (they never ran in parallel
anyway: the GIL serialises this pure-Python work)."""


@dataclass(frozen=True)
class EngineState:
    """What the player learns after reset or one command."""

    observation: str
    admissible_commands: list[str]
    won: bool


class AlfredEngine:
    """One PDDL game at a time. `load` a game, then `reset` / `step`; `plan()` replans from the current state.

    Each instance holds its own copy of the planner library (TextWorld loads one per environment), so
    instances can run side by side in threads.
    """

    def __init__(self) -> None:
        import textworld
        from textworld.envs.pddl.pddl import PddlEnv

        self._env = PddlEnv(textworld.EnvInfos(won=True, admissible_commands=True))
        self.game_path: str | None = None

    def load(self, game: str | os.PathLike[str] | Mapping[str, Any]) -> None:
        """Load a `game.tw-pddl` (path or its parsed JSON) and give its entities ALFWorld's names."""
        if isinstance(game, Mapping):
            data, self.game_path = dict(game), None
        else:
            self.game_path = os.fspath(game)
            with open(self.game_path, encoding="utf-8") as handle:
                data = json.load(handle)
        missing = {"pddl_domain", "grammar", "pddl_problem"} - set(data)
        if missing:
            raise ValueError(f"{self.game_path or 'game data'}: not a game.tw-pddl (missing {sorted(missing)})")
        with PARSE_LOCK:
            self._env.load(data)
        infos = self._env._entity_infos
        for pddl_id, name in display_names(infos).items():
            infos[pddl_id].name = name

    def reset(self) -> EngineState:
        with PARSE_LOCK:
            state = self._env.reset()
        return EngineState(state.feedback, list(state.admissible_commands), bool(state.won))

    def step(self, command: str) -> EngineState:
        with PARSE_LOCK:
            state, _, _ = self._env.step(command)
        return EngineState(state.feedback, list(state.admissible_commands), bool(state.won))

    def plan(self) -> list[str]:
        """A shortest plan (player commands) from the current state to the goal; [] when none exists or the
        goal already holds."""
        with PARSE_LOCK:
            return list(self._env._pddl_state.replan(self._env._entity_infos))

    def close(self) -> None:
        self._env.close()
