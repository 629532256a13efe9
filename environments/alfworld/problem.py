"""A concrete ALFWorld game as data (`GameSpec`) and its PDDL problem text.

The goal of each task type states the same conditions as ALFWorld's own goals for that type (see the
fixtures' `initial_state.pddl`): an object of the target class in a receptacle of the target class, in the
required state (clean / hot / cool), two distinct such objects for pick_two, and for look_at the target held
while standing at a switched-on lamp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentgym_opsd.environments.alfworld.assets import alfred_tables

__all__ = ["Receptacle", "PortableObject", "GameSpec", "problem_text", "goal_text"]


@dataclass(frozen=True)
class Receptacle:
    pddl_id: str
    cls: str
    """ALFRED class, e.g. `CounterTop`."""
    location: str
    """PDDL id of the navigation point in front of it (one receptacle per location)."""


@dataclass(frozen=True)
class PortableObject:
    pddl_id: str
    cls: str
    receptacle: Receptacle
    """Where it starts."""


@dataclass(frozen=True)
class GameSpec:
    """Everything that defines one game."""

    trial_id: str
    task_type: str
    room: str
    scene_number: int
    """ALFRED-style scene number (kitchens 1-30, living rooms 201-230, ...)."""
    object_target: str
    parent_target: str
    """Receptacle class of the goal ("" for look_at)."""
    toggle_target: str
    """Lamp class for look_at ("" otherwise)."""
    goal_sentence: str
    agent_location: str
    receptacles: tuple[Receptacle, ...]
    objects: tuple[PortableObject, ...]
    num_distractors: int = 0
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def folder_name(self) -> str:
        """ALFWorld's `<task_type>-<Obj>-<MRecep>-<Recep>-<scene>` (look_at puts the lamp in the Recep slot)."""
        recep = self.toggle_target if self.task_type == "look_at_obj_in_light" else self.parent_target
        return f"{self.task_type}-{self.object_target}-None-{recep}-{self.scene_number}"


def _goal_placed(cls: str, recep_cls: str, state: tuple[str, str] | None) -> str:
    """One object of `cls` in a receptacle of `recep_cls`, with (property, state predicate) if given."""
    conditions = [f"(objectType ?o {cls}Type)", f"(receptacleType ?r {recep_cls}Type)", "(inReceptacle ?o ?r)"]
    if state:
        conditions = [f"({state[0]} ?o)", *conditions, f"({state[1]} ?o)"]
    body = " ".join(conditions)
    return f"(exists (?r - receptacle) (exists (?o - object) (and {body})))"


_STATE_OF = {
    "pick_clean_then_place_in_recep": ("cleanable", "isClean"),
    "pick_heat_then_place_in_recep": ("heatable", "isHot"),
    "pick_cool_then_place_in_recep": ("coolable", "isCool"),
}


def goal_text(spec: GameSpec) -> str:
    kind = spec.task_type
    if kind in ("pick_and_place_simple", *_STATE_OF):
        inner = _goal_placed(spec.object_target, spec.parent_target, _STATE_OF.get(kind))
    elif kind == "pick_two_obj_and_place":
        obj, recep = spec.object_target, spec.parent_target
        inner = (
            "(exists (?r - receptacle) (exists (?o1 - object) (and "
            f"(objectType ?o1 {obj}Type) (receptacleType ?r {recep}Type) (inReceptacle ?o1 ?r) "
            "(exists (?o2 - object) (and (not (= ?o1 ?o2)) "
            f"(objectType ?o2 {obj}Type) (inReceptacle ?o2 ?r))))))"
        )
    elif kind == "look_at_obj_in_light":
        inner = (
            "(exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and "
            f"(objectType ?ot {spec.toggle_target}Type) (toggleable ?ot) (isToggled ?ot) "
            "(receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r))) "
            f"(exists (?o - object ?a - agent) (and (objectType ?o {spec.object_target}Type) (holds ?a ?o)))"
        )
    else:
        raise ValueError(f"unknown task type {kind!r}")
    return f"(:goal (and {inner}))"


def problem_text(spec: GameSpec) -> str:
    """The PDDL problem for ALFWorld's `alfred` domain."""
    tables = alfred_tables()
    object_classes = sorted({o.cls for o in spec.objects})
    receptacle_classes = sorted({r.cls for r in spec.receptacles})
    locations = sorted({r.location for r in spec.receptacles} | {spec.agent_location})
    lines = [f"(define (problem plan_{spec.trial_id})", "(:domain alfred)", "(:objects", "agent1 - agent"]
    lines += [f"{c}Type - otype" for c in object_classes]
    lines += [f"{c}Type - rtype" for c in receptacle_classes]
    lines += [f"{o.pddl_id} - object" for o in spec.objects]
    lines += [f"{r.pddl_id} - receptacle" for r in spec.receptacles]
    lines += [f"{loc} - location" for loc in locations]
    lines += [")", "(:init"]
    lines += [f"(receptacleType {r.pddl_id} {r.cls}Type)" for r in spec.receptacles]
    lines += [f"(objectType {o.pddl_id} {o.cls}Type)" for o in spec.objects]
    lines += [f"(canContain {rc}Type {oc}Type)" for rc in receptacle_classes for oc in object_classes
              if tables.can_contain(rc, oc)]
    for o in spec.objects:
        if o.cls in tables.toggleable:
            lines.append(f"(toggleable {o.pddl_id})")  # lamps stay where they stand
            continue
        lines.append(f"(pickupable {o.pddl_id})")
        if o.cls in tables.movable_receptacles:
            lines.append(f"(isReceptacleObject {o.pddl_id})")
        for predicate, classes in (("cleanable", tables.cleanable), ("heatable", tables.heatable),
                                   ("coolable", tables.coolable), ("sliceable", tables.sliceable)):
            if o.cls in classes:
                lines.append(f"({predicate} {o.pddl_id})")
    lines += [f"(openable {r.pddl_id})" for r in spec.receptacles if r.cls in tables.openable]
    lines.append(f"(atLocation agent1 {spec.agent_location})")
    lines += [f"(inReceptacle {o.pddl_id} {o.receptacle.pddl_id})" for o in spec.objects]
    lines += [f"(receptacleAtLocation {r.pddl_id} {r.location})" for r in spec.receptacles]
    lines += [f"(objectAtLocation {o.pddl_id} {o.receptacle.location})" for o in spec.objects]
    lines += [")", goal_text(spec), ")", ""]
    return "\n".join(lines)
