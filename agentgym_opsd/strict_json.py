"""Reading JSON text from a file as strictly as our writers write it (`files.to_json`).

`json.loads` accepts what JSON has no room for: `NaN`, `Infinity`, a number such as `1e999` that becomes
infinity, and it fails on an integer of more than 4,300 digits with a message that names no field. Our writers
put null where a number was not finite, so such a value in a file is damage or a hand edit: `loads_strict`
refuses it with a ValueError naming the field (`turns[0].evidence`), and, when asked, a string longer than a
bound (a page or a report would carry it whole).

Cost: the parser calls back once per float (to see an overflow to infinity; a line of log-probs costs more than
`json.loads` would, text nothing extra). NaN and Infinity call back only where they occur, an oversized integer
only on the retry after `json.loads` refused it, and the walk that names the field runs only on a refusal (or
a line longer than the string bound), without recursion.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["MAX_INT_DIGITS", "loads_strict"]

MAX_INT_DIGITS = sys.int_info.default_max_str_digits
"""Python's limit on the digits of an integer read from text (4,300): longer ones are refused by field."""

class _Refused:
    """Stands where the parser met a number JSON cannot hold, so the walk can name its field."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def _constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number (the writers write null for it)")


def _float(text: str) -> float | _Refused:
    value = float(text)
    if value - value == 0.0:  # finite (inf - inf is nan); one comparison, as this runs for every float
        return value
    return _Refused(f"{text[:20]}{'...' if len(text) > 20 else ''} is too large for a number (it reads as infinity)")


def _int(text: str) -> int | _Refused:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else _Refused(f"an integer of {digits} digits; at most "
                                                               f"{MAX_INT_DIGITS} are read")


def _first_refused(value: Any, max_string_chars: int | None) -> tuple[str, str] | None:
    """(field path, why) of the first refused value in document order, or None."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, _Refused):
            return path or "(the whole value)", item.why
        if isinstance(item, str) and max_string_chars is not None and len(item) > max_string_chars:
            return path or "(the whole value)", f"a string of {len(item)} characters; at most {max_string_chars}"
        if isinstance(item, dict):
            for key, sub in reversed(item.items()):
                if max_string_chars is not None and len(key) > max_string_chars:
                    return (f"{path} " if path else "") + "(a key)", f"a key of {len(key)} characters; at most {max_string_chars}"
                stack.append((f"{path}.{key}" if path else key, sub))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item))))
    return None


def loads_strict(text: str, *, max_string_chars: int | None = None) -> Any:
    """`json.loads(text)`, refusing NaN, ±Infinity, numbers that overflow to infinity, integers of more than
    `MAX_INT_DIGITS` digits and (with `max_string_chars`) longer strings, each as a ValueError
    `field 'turns[0].evidence': why`. Malformed JSON raises json.JSONDecodeError as `json.loads` does."""
    refused = False

    def refuse(marker: _Refused) -> _Refused:
        nonlocal refused
        refused = True
        return marker

    def checked_float(number: str) -> float | _Refused:
        value = _float(number)
        return refuse(value) if isinstance(value, _Refused) else value

    def constant(name: str) -> _Refused:
        return refuse(_constant(name))

    try:
        value = json.loads(text, parse_constant=constant, parse_float=checked_float)
    except json.JSONDecodeError:
        raise
    except ValueError:  # an integer past Python's digit limit: parse again, marking it, to name its field
        value = json.loads(text, parse_constant=constant, parse_float=checked_float, parse_int=_int)
        refused = True
    if refused or (max_string_chars is not None and len(text) > max_string_chars):
        found = _first_refused(value, max_string_chars)
        if found is not None:
            raise ValueError(f"field {found[0]!r}: {found[1]}")
    return value
