"""What the servers' and tools' command lines share: numeric argument types whose usage errors read alike,
and the HTTP host's limit flags."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

from agentgym_opsd.serving.host import ConnectionLimits, HTTPLimits, stop_on_sigint_and_sigterm

LimitsT = TypeVar("LimitsT", bound=ConnectionLimits)

__all__ = ["add_limit_arguments", "limits_from_args", "non_negative_float", "non_negative_int", "number_type",
           "port_number", "positive_float", "positive_int", "stop_on_sigint_and_sigterm"]


def number_type(cast: Callable[[str], Any], accept: Callable[[Any], bool], requirement: str, *,
                name: str = "", subject: str = "") -> Callable[[str], Any]:
    """An argparse type: `cast(text)` (a usage error naming the text when it is not a number), then
    `accept(value)` (a usage error saying `must be <requirement>` otherwise). The servers' and tools'
    numeric flags are all built from this, so their messages read alike."""
    noun = "an integer" if cast is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {name or noun}: {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{subject + ' ' if subject else ''}must be {requirement}, got {text}")
        return value

    parse.__name__ = name or cast.__name__  # argparse names the type in some messages
    return parse


port_number = number_type(int, lambda v: 0 <= v <= 65535, "in 0..65535 (0 = any free port)", name="a port number",
                          subject="port")
"""argparse type: a TCP port in 0..65535 (0 = any free port)."""
positive_int = number_type(int, lambda v: v >= 1, ">= 1")
"""argparse type: an integer >= 1."""
non_negative_int = number_type(int, lambda v: v >= 0, ">= 0")
"""argparse type: an integer >= 0."""
positive_float = number_type(float, lambda v: 0 < v < math.inf, "a finite number > 0")
"""argparse type: a finite number > 0."""
non_negative_float = number_type(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")
"""argparse type: a finite number >= 0."""


def add_limit_arguments(parser: argparse.ArgumentParser, defaults: ConnectionLimits) -> None:
    """The HTTP host's flags, the same on every server that runs on it: the connection limits
    (`host.ConnectionLimits`) and, for a WSGI host (`host.HTTPLimits`), its workers and queue; `defaults` are the
    server's own. `limits_from_args` turns them back into limits of the same class."""
    group = parser.add_argument_group("connections (beyond a cap: a JSON 503 with Retry-After; too slow: 408)")
    if isinstance(defaults, HTTPLimits):
        group.add_argument("--workers", type=positive_int, default=defaults.workers,
                           help=f"threads answering requests, the most answered at once (default {defaults.workers})")
        group.add_argument("--max-pending", type=positive_int, default=defaults.max_pending,
                           help=f"requests read whole that may wait for a worker (default {defaults.max_pending})")
    group.add_argument("--max-connections", type=positive_int, default=defaults.max_connections,
                       help=f"open connections of any kind, idle or sending included (default "
                            f"{defaults.max_connections})")
    group.add_argument("--header-timeout", type=positive_float, default=defaults.header_timeout_s,
                       help=f"seconds a client may take to send its request head; then 408 (default "
                            f"{defaults.header_timeout_s:g})")
    group.add_argument("--body-timeout", type=positive_float, default=defaults.body_timeout_s,
                       help=f"seconds a client may take to send its body after the head; then 408 (default "
                            f"{defaults.body_timeout_s:g})")
    group.add_argument("--shutdown-grace", type=positive_float, default=defaults.shutdown_grace_s,
                       help=f"seconds the requests in progress at SIGINT/SIGTERM may take to end; meanwhile new "
                            f"requests get 503 (default {defaults.shutdown_grace_s:g})")


def limits_from_args(args: argparse.Namespace, defaults: LimitsT, **fields: Any) -> LimitsT:
    """`defaults` with the flags `add_limit_arguments` added and `fields` (a server's own flags) in their place,
    made and checked once (a check across fields sees them all)."""
    workers = {"workers": args.workers, "max_pending": args.max_pending} if isinstance(defaults, HTTPLimits) else {}
    return dataclasses.replace(defaults, **workers, max_connections=args.max_connections,
                               header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                               shutdown_grace_s=args.shutdown_grace, **fields)
