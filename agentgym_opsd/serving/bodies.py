"""Reading a JSON request body that cannot hurt the server, for the three HTTP servers (shop site,
retrieval server, policy server).

Every hostile body gets a JSON error and a 4xx, never an HTML 500 page:
- more than `max_bytes` (by Content-Length or, for chunked bodies, by what was actually sent) -> 413;
- malformed JSON, non-UTF-8 bytes, `NaN`/`Infinity`, nesting deeper than `max_depth`, lone UTF-16
  surrogates in a string (they cannot be encoded later, by the tokenizer or by `jsonify`) -> 400.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodyError", "MAX_JSON_DEPTH", "parse_json_text", "read_json_body"]

MAX_JSON_DEPTH = 32  # our request schemas nest 3 levels; 32 leaves room and stays far from Python's stack


class BodyError(ValueError):
    """A request body that is refused; `status` is the HTTP status to answer with (400 or 413)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _nesting_depth_exceeds(text: str, max_depth: int) -> bool:
    """Whether brackets outside strings nest deeper than `max_depth`, without recursion (json.loads on
    100,000 '[' raises RecursionError, and shallower bodies can still blow the stack of later code)."""
    if text.count("[") + text.count("{") <= max_depth:
        # Too few brackets to nest that deep, wherever they are: most bodies end here, counted in C. The loop
        # below takes a tenth of a second a megabyte holding the GIL, which a few dozen concurrent bodies of
        # plain text made seconds of delay for every other request.
        return False
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _refuse_constant(name: str) -> Any:
    raise BodyError(f"{name} is not valid JSON")


def parse_json_text(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a JSON body that has already been size-checked; raises BodyError(400) saying what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("the body is not UTF-8") from None
    if _nesting_depth_exceeds(text, max_depth):
        raise BodyError(f"JSON nested deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise BodyError(f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (Python's int-from-text limit)
        raise BodyError(f"unacceptable JSON value: {str(exc)[:120]}") from None
    except RecursionError:  # unreachable after the depth scan, kept as a last guard
        raise BodyError("JSON nested too deeply") from None
    if _has_lone_surrogate(value):
        raise BodyError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text")
    return value


def read_json_body(request: Any, *, max_bytes: int, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Read and parse the JSON body of a Flask/werkzeug `request`, refusing it with BodyError when it is
    too large (413) or not acceptable JSON (400). Chunked bodies are read up to one byte past the limit,
    so an oversize body is refused, never silently cut."""
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise BodyError(f"the body is {declared} bytes; at most {max_bytes} are accepted", 413)
    raw = request.stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise BodyError(f"the body is over {max_bytes} bytes; at most {max_bytes} are accepted", 413)
    if not raw.strip():
        raise BodyError("the body is empty; a JSON object is expected")
    return parse_json_text(raw, max_depth=max_depth)
