"""Solvability check: fast-downward (through TextWorld's PDDL logic) plans a problem from its initial state.

The domain and grammar are parsed once per process (the slow part of loading a game), so checking a new
problem only translates it and searches (a few tens of milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass

from agentgym_opsd.environments.alfworld.assets import domain_text, grammar_text
from agentgym_opsd.environments.alfworld.engine import PARSE_LOCK
from agentgym_opsd.environments.alfworld.names import display_names

__all__ = ["PlanResult", "PlanChecker"]


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
