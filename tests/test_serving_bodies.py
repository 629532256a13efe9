"""The shared request-body reader refuses hostile bodies with 400/413 and a message, never a crash."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentgym_opsd.serving import (
    BodyError,
    parse_json_text,
    port_number,
    positive_float,
    positive_int,
    read_json_body,
)


class _Request:
    def __init__(self, body: bytes, declared: int | None) -> None:
        self.content_length = declared
        self.stream = io.BytesIO(body)


def _read(body: bytes, declared: int | None = -1, max_bytes: int = 1000) -> object:
    return read_json_body(_Request(body, len(body) if declared == -1 else declared), max_bytes=max_bytes)


def test_a_plain_object_is_parsed() -> None:
    assert _read(b'{"a": [1, 2, {"b": "c"}]}') == {"a": [1, 2, {"b": "c"}]}


@pytest.mark.parametrize("declared", [2000, None])  # None: a chunked body, no Content-Length
def test_an_oversize_body_is_413_whether_declared_or_chunked(declared: int | None) -> None:
    with pytest.raises(BodyError) as err:
        _read(b'{"a": "' + b"x" * 1500 + b'"}', declared=declared)
    assert err.value.status == 413


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50 + b"1" + b"}" * 50])
def test_deep_nesting_is_400(body: bytes) -> None:
    with pytest.raises(BodyError, match="nested deeper") as err:
        read_json_body(_Request(body, len(body)), max_bytes=1_000_000)
    assert err.value.status == 400


@pytest.mark.parametrize("body, message", [
    (b'{"t": NaN}', "NaN"), (b'{"t": -Infinity}', "Infinity"), (b'{"s": "\\ud800"}', "surrogate"),
    (b"\xff\xfe", "UTF-8"), (b'{"a": ', "malformed"), (b"   ", "empty"),
])
def test_non_json_content_is_400_with_a_reason(body: bytes, message: str) -> None:
    with pytest.raises(BodyError, match=message) as err:
        _read(body)
    assert err.value.status == 400


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = json.dumps({"q": "[" * 500 + '\\"{' * 100})
    assert parse_json_text(text.encode())["q"].startswith("[[[")


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids, max_size=3),
                    max_leaves=20))
def test_any_shallow_json_value_round_trips(value: object) -> None:
    raw = json.dumps(value).encode()
    try:
        assert parse_json_text(raw, max_depth=64) == value
    except BodyError as exc:  # only refusals the reader promises: surrogates from st.text
        assert "surrogate" in str(exc)


@pytest.mark.parametrize("text", ["-1", "65536", "99999", "http"])
def test_ports_outside_the_range_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        port_number(text)
    assert port_number("0") == 0 and port_number("65535") == 65535


def test_positive_number_types() -> None:
    for bad in ["0", "-3", "x"]:
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int(bad)
    for bad in ["0", "-1", "nan", "inf", "x"]:
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(bad)
    assert positive_int("3") == 3 and positive_float("0.5") == 0.5


def test_an_integer_past_pythons_digit_limit_is_400_not_a_crash() -> None:
    with pytest.raises(BodyError, match="unacceptable JSON value") as err:
        parse_json_text(b'{"n": ' + b"9" * 5000 + b"}")
    assert err.value.status == 400


@pytest.mark.parametrize("text, exceeds", [
    ("[" * 32 + "]" * 32, False),  # exactly the limit
    ("[" * 33 + "]" * 33, True),
    ("{" * 20 + "[" * 13, True),  # both kinds count, and an unclosed body still counts
    ('["' + "[" * 100 + '"]', False),  # more brackets than the limit, but inside a string
    ("[]" * 1000, False),
    ("plain text " * 1000, False),  # no brackets: decided without the character loop
])
def test_nesting_depth_at_the_limit(text: str, exceeds: bool) -> None:
    from agentgym_opsd.serving.bodies import _nesting_depth_exceeds

    assert _nesting_depth_exceeds(text, 32) is exceeds
