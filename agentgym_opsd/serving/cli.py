"""What the servers' and tools' command lines share: numeric argument types whose usage errors read alike,
and serving an app in the foreground."""

from __future__ import annotations

import argparse
import dataclasses
import math
import signal
import threading
from collections.abc import Callable
from typing import Any

from werkzeug.serving import make_server

from agentgym_opsd.serving.pool import PooledWSGIServer, WorkerPool

_ACCEPT_POLL_S = 0.2  # how soon the accepting loop sees a stop

__all__ = ["add_pool_arguments", "non_negative_float", "non_negative_int", "number_type", "pool_from_args",
           "port_number", "positive_float", "positive_int", "serve_until_interrupted", "stop_on_sigint_and_sigterm"]


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


def add_pool_arguments(parser: argparse.ArgumentParser, defaults: WorkerPool) -> None:
    """The connection layer's flags (`WorkerPool`), the same on every server that runs on it; `defaults` are
    the server's own. `pool_from_args` turns them back into a WorkerPool."""
    group = parser.add_argument_group("connections (beyond a cap: a JSON 503 with Retry-After; too slow: 408)")
    group.add_argument("--workers", type=positive_int, default=defaults.workers,
                       help=f"threads answering requests, the most answered at once (default {defaults.workers})")
    group.add_argument("--max-pending", type=positive_int, default=defaults.max_pending,
                       help=f"requests that may wait for a worker (default {defaults.max_pending})")
    group.add_argument("--max-reading", type=positive_int, default=defaults.max_reading,
                       help=f"connections whose request is still arriving, read without a worker (default "
                            f"{defaults.max_reading})")
    group.add_argument("--header-timeout", type=positive_float, default=defaults.header_timeout_s,
                       help=f"seconds a client may take to send its request head; then 408 (default "
                            f"{defaults.header_timeout_s:g})")
    group.add_argument("--body-timeout", type=positive_float, default=defaults.body_timeout_s,
                       help=f"seconds a client may take to send its body after the head; then 408 (default "
                            f"{defaults.body_timeout_s:g})")
    group.add_argument("--shutdown-grace", type=positive_float, default=defaults.shutdown_grace_s,
                       help=f"seconds the requests in progress at SIGINT/SIGTERM may take to end; meanwhile new "
                            f"connections get 503 (default {defaults.shutdown_grace_s:g})")


def pool_from_args(args: argparse.Namespace, defaults: WorkerPool) -> WorkerPool:
    """The WorkerPool of the flags `add_pool_arguments` added, the rest of it from `defaults`."""
    return dataclasses.replace(defaults, workers=args.workers, max_pending=args.max_pending,
                               max_reading=args.max_reading, header_timeout_s=args.header_timeout,
                               body_timeout_s=args.body_timeout, shutdown_grace_s=args.shutdown_grace)


def serve_until_interrupted(app: Any, host: str, port: int, banner: Callable[[str], str], *,
                            pool: WorkerPool | None = None, cancel_in_flight: Callable[[], None] | None = None,
                            **server_kwargs: Any) -> None:
    """Bind `host:port` (port 0 picks a free one), print `banner(url)` with the bound address, serve until
    interrupted (SIGINT or SIGTERM), then close the socket: with `pool`, on its fixed pool of workers (a
    connection beyond its caps gets 503, slow clients 408, `pool.PooledWSGIServer`), else on a thread per
    connection. With `pool` a stop also lets the requests in progress end (`PooledWSGIServer.stop`: after
    `pool.shutdown_grace_s` it calls `cancel_in_flight`) before returning, so no worker is inside the app
    when the process exits; a second signal during that wait stops at once. Werkzeug's server never runs
    its debugger, whatever FLASK_DEBUG says (the debugger console on a 500 page would run anyone's code)."""
    if pool is not None:
        server = PooledWSGIServer(host, port, app, pool, **server_kwargs)
    else:
        server = make_server(host, port, app, threaded=True, **server_kwargs)
    previous = stop_on_sigint_and_sigterm()  # before the banner: a client may signal as soon as it reads it
    # The accepting loop runs on a thread of its own and this one only waits: the signal's KeyboardInterrupt
    # lands in the main thread, and raised inside the loop, between an accept and the hand-off of the
    # connection, it dropped that client unanswered (a reset, seen under load in CI). `shutdown` ends the
    # loop after the connection it is handing off.
    accepting = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": _ACCEPT_POLL_S},
                                 name="http-accept", daemon=True)
    try:
        print(banner(f"http://{host}:{server.server_port}"), flush=True)
        accepting.start()
        while accepting.is_alive():
            accepting.join(timeout=1.0)
    except KeyboardInterrupt:
        pass
    finally:
        try:
            if accepting.is_alive():
                server.shutdown()
            if isinstance(server, PooledWSGIServer):
                server.stop(cancel_in_flight)
            else:
                server.server_close()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _raise_keyboard_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def stop_on_sigint_and_sigterm() -> dict[int, Any]:
    """SIGINT and SIGTERM stop the server (the previous handlers are returned). SIGINT is set again on purpose:
    a process started in the background of a non-interactive shell inherits SIGINT *ignored*, and Python
    then never installs its KeyboardInterrupt handler, so such a server ran on after Ctrl-C or `kill -INT`
    (seen in CI runs launched in the background). Only the main thread may set handlers; elsewhere nothing
    changes."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, _raise_keyboard_interrupt)
    return previous
