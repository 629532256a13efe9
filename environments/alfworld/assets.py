"""Read-only ALFWorld assets from the installed `alfworld` wheel: the PDDL domain, the text grammar, the goal
sentence templates and ALFRED's object/receptacle fact tables.

Only data files and plain-data modules are touched (no torch, no cv2), and each is read once per process.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

__all__ = ["GOAL_PLACEHOLDER", "domain_text", "grammar_text", "goal_templates", "alfred_tables", "AlfredTables"]

GOAL_PLACEHOLDER = "UNKNOWN GOAL"
"""The text in ALFWorld's grammar that a game replaces with its goal sentence."""


@functools.cache
def domain_text() -> str:
    """ALFWorld's `alfred.pddl`, verbatim (a game file embeds it unchanged)."""
    return resources.files("alfworld").joinpath("data/alfred.pddl").read_text(encoding="utf-8")


@functools.cache
def grammar_text() -> str:
    """ALFWorld's `alfred.twl2` with the goal placeholder still in it."""
    return resources.files("alfworld").joinpath("data/alfred.twl2").read_text(encoding="utf-8")


@functools.cache
def goal_templates() -> dict[str, tuple[str, ...]]:
    """task type -> goal sentence templates (`{obj}`, `{recep}`, `{toggle}` fields), from the wheel."""
    from alfworld.gen import goal_library  # plain dicts of strings

    return {name: tuple(entry["templates"]) for name, entry in goal_library.gdict.items()}


class AlfredTables:
    """ALFRED's fact tables: which receptacle class holds which object classes, and which classes can be
    heated, cooled, cleaned, toggled or sliced."""

    def __init__(self, receptacle_objects: dict[str, set[str]], action_objects: dict[str, set[str]],
                 openable: set[str], movable_receptacles: set[str]) -> None:
        self.receptacle_objects = receptacle_objects
        self.heatable = frozenset(action_objects["Heatable"])
        self.coolable = frozenset(action_objects["Coolable"])
        self.cleanable = frozenset(action_objects["Cleanable"])
        self.toggleable = frozenset(action_objects["Toggleable"])
        self.sliceable = frozenset(action_objects["Sliceable"])
        self.openable = frozenset(openable)
        self.movable_receptacles = frozenset(movable_receptacles)

    def can_contain(self, receptacle: str, obj: str) -> bool:
        return obj in self.receptacle_objects.get(receptacle, ())


@functools.cache
def alfred_tables() -> AlfredTables:
    from alfworld.gen import constants  # plain dicts and lists (~10 ms to import)

    tables: Any = constants
    return AlfredTables(
        receptacle_objects={k: set(v) for k, v in tables.VAL_RECEPTACLE_OBJECTS.items()},
        action_objects={k: set(v) for k, v in tables.VAL_ACTION_OBJECTS.items()},
        openable=set(tables.OPENABLE_CLASS_LIST),
        movable_receptacles=set(tables.MOVABLE_RECEPTACLES),
    )
