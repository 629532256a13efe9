"""Solvability check: fast-downward (through TextWorld's PDDL logic) plans a problem from its initial state;
and `PlanCache`, the per-state memo of plans behind the environment's oracle distance.

The domain and grammar are parsed once per process (the slow part of loading a game), so checking a new
problem only translates it and searches (a few tens of milliseconds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agentgym_opsd.environments.alfworld.assets import domain_text, grammar_text
from agentgym_opsd.environments.alfworld.engine import PARSE_LOCK
from agentgym_opsd.environments.alfworld.names import display_names

__all__ = ["PLAN_CACHE", "PlanCache", "PlanChecker", "PlanResult"]


@dataclass(frozen=True)
class PlanResult:
    solvable: bool
    plan: tuple[str, ...]
    """Player commands of the planner's plan (ALFWorld names); empty when unsolvable."""
    won_at_start: bool
    """The goal already holds in the initial state (a game we never generate)."""


class PlanChecker:
    """Plans PDDL problems of the alfred domain; not thread-safe (one planner library per instance)."""

    def __init__(self) -> None:
        import fast_downward
        from textworld.envs.pddl import logic as pddl_logic

        from agentgym_opsd.environments.alfworld.grammar import game_logic

        self._lib = fast_downward.load_lib()
        with PARSE_LOCK:  # TextWorld's grammar parser is not thread-safe
            self._logic = game_logic(domain_text(), grammar_text())  # parsed once per process
        self._pddl_logic = pddl_logic

    def check(self, problem: str) -> PlanResult:
        from textworld.generator.game import EntityInfo

        with PARSE_LOCK:  # fast-downward's translator sets module-wide options: one translation at a time
            state = self._pddl_logic.PddlState(self._lib, problem, self._logic)
        if state.check_goal():
            return PlanResult(True, (), True)
        infos = {v.name: EntityInfo(v.name, v.type) for fact in state.facts for v in fact.arguments}
        for pddl_id, name in display_names(infos).items():
            infos[pddl_id].name = name
        plan = tuple(state.replan(infos))
        return PlanResult(bool(plan), plan, False)


class PlanCache:
    """Plans from already-seen states, keyed by (game, the state's facts): the oracle distance asks for a plan
    after every step off the expert's path, and the G rollouts of a task keep revisiting the same states.

    Process-wide and thread-safe (EnvPool steps environments in threads); least recently used entries go
    first. A plan is stored as a tuple: callers get a fresh list they may pop from.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, frozenset[str]], tuple[str, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def plan(self, game: str, facts: Iterable[object], make: Callable[[], Sequence[str]]) -> list[str]:
        """The cached plan of `game` from the state holding `facts`, else `make()` (stored)."""
        key = (game, frozenset(map(str, facts)))  # a state is its set of true facts, whatever the path to it
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return list(self._items[key])
        plan = tuple(make())  # outside the lock: planning takes the engine's own lock
        with self._lock:
            self.misses += 1
            self._items[key] = plan
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return list(plan)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0


PLAN_CACHE = PlanCache()
"""The cache every `ALFWorldEnv` of this process shares."""
