"""ALFRED object names in PDDL and the names the player reads.

A PDDL id encodes a class and a position: `Mug|+00.50|+00.94|-01.46` is written
`Mug_bar__plus_00_dot_50_bar__plus_00_dot_94_bar__minus_01_dot_46`. The player sees "mug 1": the class (the
text before the first `|`, lower-cased by the planner's translator, with "basin" appended when the id
mentions a basin) and a number per class. ALFWorld numbers the ids of a class in sorted order from the
highest number down; we follow the same rule so that our games read exactly like ALFWorld's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

__all__ = ["encode_id", "position_id", "location_id", "sink_id", "display_names"]

_ENCODINGS = (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_"), (",", "_comma_"))


def encode_id(text: str) -> str:
    """`Mug|+00.50|...` -> `Mug_bar__plus_00_dot_50_bar_...` (PDDL names cannot hold `|+-.,`)."""
    for raw, coded in _ENCODINGS:
        text = text.replace(raw, coded)
    return text


def _decode(text: str) -> str:
    for raw, coded in _ENCODINGS:
        text = text.replace(coded, raw)
    return text


def _coordinate(value: float) -> str:
    return f"{value:+06.2f}"  # ALFRED writes +00.50 / -01.46


def position_id(class_name: str, xyz: tuple[float, float, float], suffix: str = "") -> str:
    """PDDL id of an object or receptacle of `class_name` at position `xyz` (metres)."""
    parts = [class_name, *(_coordinate(v) for v in xyz)]
    if suffix:
        parts.append(suffix)
    return encode_id("|".join(parts))


def sink_id(class_name: str, xyz: tuple[float, float, float]) -> str:
    """Basins are named after their fixture (`Sink|...|SinkBasin`) so the player reads "sinkbasin 1"."""
    fixture = class_name.removesuffix("Basin")
    return position_id(fixture, xyz, suffix=class_name)


def location_id(x: int, z: int, rotation: int, horizon: int) -> str:
    """A navigation point: grid x, grid z, rotation (0-3) and camera horizon (degrees)."""
    return encode_id(f"loc|{x}|{z}|{rotation}|{horizon}")


def display_names(ids: Iterable[str]) -> dict[str, str]:
    """PDDL id -> the name shown to the player ("mug 1"; ids without a position keep their text plus a
    trailing space, as ALFWorld prints them)."""
    ordered = sorted(set(ids))
    classes: dict[str, str | None] = {}
    for pddl_id in ordered:
        head, sep, _ = pddl_id.partition("_bar_")
        classes[pddl_id] = (head + ("basin" if "basin" in pddl_id else "")) if sep else None
    counts = Counter(c for c in classes.values() if c is not None)
    next_number = dict(counts)  # numbers are handed out from the top down, in sorted id order
    names = {}
    for pddl_id in ordered:
        cls = classes[pddl_id]
        if cls is None:
            names[pddl_id] = f"{_decode(pddl_id)} "
        else:
            names[pddl_id] = f"{cls} {next_number[cls]}"
            next_number[cls] -= 1
    return names
