"""The one HTTP server every server we ship runs on: uvicorn with its limits set and our guards around the app.

- `connection_protocol`: uvicorn's h11 protocol with a deadline on each request head (JSON 408), a cap on open
  connections (JSON 503), a 413 at once for a body declared over the limit, and JSON for h11's refusals (400);
- `GuardedHTTP`: each guarded body is read whole on the event loop, under its deadline and size limit, so a stalled
  client holds a coroutine, never a worker thread; at most `max_in_progress` requests are in the app (then 503);
- `wsgi_host`: a WSGI app (Flask) behind the guard on `limits.workers` threads; `serve` runs a guarded app until
  SIGINT or SIGTERM, `BackgroundServer` on a thread.
A stop drains first: new requests get 503 with Retry-After, and the listening socket closes once none has been in
progress for `DRAIN_QUIET_S` (or the grace is spent: `cancel_in_flight`), as closing it at once would drop the
queued connections unanswered. A second signal stops at once; the process waits for its worker threads to exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import math
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields
from typing import Any

from agentgym_opsd.serving.bodies import BodyError, parse_json_text

__all__ = ["DRAIN_QUIET_S", "BackgroundServer", "ConnectionLimits", "GuardedHTTP", "HTTPLimits", "bind", "build_server",
           "client_alive_check", "connection_protocol", "json_response", "send_json", "serve",
           "stop_on_sigint_and_sigterm", "wsgi_host"]

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

DRAIN_QUIET_S = 0.3
"""A stopping server closes its listening socket once no request has been in progress for this long (within the
grace): longer than a client's next request takes to arrive after its answer, shorter than the Retry-After
(>= 1 s) its 503s ask for."""


_client_alive: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("client_alive", default=None)


def client_alive_check() -> Callable[[], bool] | None:
    """Inside a request of a `wsgi_host` app (its worker thread included): a function that tells whether the
    client is still connected (False once it hung up); None elsewhere (a test client, another server)."""
    return _client_alive.get()


REFUSED_LINGER_S = 1.0
"""Seconds a connection the protocol refused (408, 413, 400, 503 over the connection cap) stays half-open for its
client to read the answer and close."""


@dataclass(frozen=True)
class ConnectionLimits:
    """What every server we ship holds a client to, whatever its app: the connections it keeps, the largest body,
    how long a head and a body may take, the Retry-After of its 503s, the grace of a stop. A field that is not a
    finite number of seconds > 0 (a name ending in `_s`) or an integer >= 1 is refused by name."""

    max_connections: int = 512
    """Open connections of any kind (idle, sending, waiting, answered); one more gets a JSON 503."""
    max_body_bytes: int = 2 * 1024 * 1024
    """The largest request body: a larger Content-Length, chunk or body so far gets 413 at once."""
    header_timeout_s: float = 10.0
    """Seconds from a connection's accept (or its previous answer) to the end of its request head; then 408."""
    body_timeout_s: float = 30.0
    """Seconds a body may take to arrive once its head has; then 408."""
    retry_after_s: int = 1
    """The Retry-After of a 503 (seconds)."""
    shutdown_grace_s: float = 5.0
    """Seconds the requests in progress at a stop may take to end before the app is asked to cancel them."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            seconds = f.name.endswith("_s")
            kinds = (int, float) if seconds else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
                what = "a finite number of seconds > 0" if seconds else "an integer >= 1"
                raise ValueError(f"{type(self).__name__}.{f.name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class HTTPLimits(ConnectionLimits):
    """The limits of a WSGI app's host (`wsgi_host`): its worker threads and the requests that may wait for one."""

    workers: int = 32
    """Requests the app answers at once (for a WSGI app: its threads)."""
    max_pending: int = 128
    """Requests read whole and waiting for a worker; one more gets a JSON 503 with Retry-After."""

    @property
    def max_in_progress(self) -> int:
        return self.workers + self.max_pending


def json_response(status: int, reason: str, body: dict[str, Any], retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer with a JSON body that closes its connection, for what the protocol answers itself."""
    data = json.dumps(body).encode()
    retry = f"Retry-After: {retry_after_s}\r\n" if retry_after_s is not None else ""
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"{retry}Connection: close\r\n\r\n")
    return head.encode("ascii") + data


def connection_protocol(header_timeout_s: float, max_connections: int, retry_after_s: int, max_body_bytes: int) -> type:
    """A uvicorn h11 protocol class (uvicorn.Config(http=...)) with the head deadline, the connection cap, a 413 at
    once for a chunk whose declared size is over `max_body_bytes` (the app sees only the bytes that arrived, so such
    a chunk trickled would otherwise wait for the body deadline) and JSON 400s."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    too_slow = json_response(408, "Request Timeout", {
        "error": f"the request head did not arrive within {header_timeout_s:g} s", "limit": "header_timeout_s",
        "max": header_timeout_s})
    too_many = json_response(503, "Service Unavailable", {
        "error": f"the server holds {max_connections} connections already; retry after {retry_after_s} s",
        "limit": "max_connections", "max": max_connections}, retry_after_s)
    too_large = json_response(413, "Content Too Large", {
        "error": f"a chunk of the body is over {max_body_bytes} bytes; at most {max_body_bytes} are accepted",
        "limit": "max_body_bytes", "max": max_body_bytes})

    class GuardedH11Protocol(H11Protocol):  # type: ignore[misc]
        _head_timer: asyncio.TimerHandle | None = None
        _waiting_cycle: Any = None  # the request cycle before the head the timer waits for
        _refused = False

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                self._refuse(too_many)
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # what a refused client still sends is read and dropped
            super().data_received(data)
            upgraded = self.transport.get_protocol() is not self  # a WebSocket now owns the connection
            if self._head_timer is not None and (upgraded or self.cycle is not self._waiting_cycle):
                self._disarm()  # the head arrived: the app reads the body within its own deadline
            # h11 keeps the size still to come of the chunk being read (a private field: absent, nothing is checked)
            chunk_left = getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0)
            if not upgraded and isinstance(chunk_left, int) and chunk_left > max_body_bytes:
                if self.cycle is not None:  # the app's read of the body sees a disconnect and answers nothing
                    self.cycle.disconnected = True
                    self.cycle.message_event.set()
                self._refuse(too_large)

        def eof_received(self) -> bool | None:
            if self._refused:
                self.transport.close()
                return None
            return super().eof_received()  # type: ignore[no-any-return]

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self._refused:
                self._arm()  # a keep-alive connection waits for its next head under the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": msg}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            try:
                events = [h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()]
                data = b"".join(self.conn.send(event) or b"" for event in events)
            except h11.LocalProtocolError:  # h11 gave up before it knew the request's HTTP version
                data = json_response(400, "Bad Request", {"error": msg})
            self._refuse(data)

        def _refuse(self, answer: bytes) -> None:
            """Write `answer`, then end the connection without resetting it: close it at once, with the client's
            unread bytes in the kernel's buffer, and the kernel sends a reset that can overtake the answer. So
            our side is half-closed after the answer, what the client still sends is dropped, and the connection
            closes when the client closes its side or `REFUSED_LINGER_S` have passed."""
            self._disarm()
            self._refused = True
            self.transport.write(answer)
            with contextlib.suppress(Exception):
                if self.transport.can_write_eof():
                    self.transport.write_eof()
                self.transport.resume_reading()
            self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

        def _arm(self) -> None:
            self._disarm()
            self._waiting_cycle = self.cycle
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            if self.cycle is self._waiting_cycle:
                self._refuse(too_slow)

    return GuardedH11Protocol


async def send_json(send: Send, status: int, body: dict[str, Any], *, retry_after_s: int | None = None) -> None:
    """A JSON answer that closes the connection (the rest of a body it did not read would be taken for the next
    request)."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               (b"connection", b"close")]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _watch_disconnect(receive: Receive, gone: threading.Event) -> None:
    """Set `gone` when the client hangs up (the body is read: the connection's next message is its end)."""
    with contextlib.suppress(Exception):
        if (await receive())["type"] == "http.disconnect":
            gone.set()


class GuardedHTTP:
    """`app` (ASGI) behind the guards of the module docstring, within `limits`;
    `max_in_progress` bounds the guarded requests in the app at once; `guarded_methods` are the methods whose
    requests are guarded (None: all; others pass straight through); `check_json` runs the JSON checks of
    `serving.bodies` on a non-empty body before the app sees it; `cancel_in_flight` is called once when a stop's
    grace is spent with requests still in progress. `lifespan`: whether the app speaks ASGI lifespan;
    `watch_disconnect`: the app's requests can ask `client_alive_check()` whether their client is still there."""

    def __init__(self, app: Any, limits: ConnectionLimits, *, max_in_progress: int, guarded_methods: frozenset[str] | None = None,
                 check_json: bool = False, cancel_in_flight: Callable[[], None] | None = None,
                 busy: dict[str, Any] | None = None, lifespan: bool = True, watch_disconnect: bool = False) -> None:
        self.app = app
        self.limits = limits
        self.max_in_progress = max_in_progress
        self.guarded_methods = guarded_methods
        self.check_json = check_json
        self.cancel_in_flight = cancel_in_flight
        self.lifespan = lifespan
        self.watch_disconnect = watch_disconnect
        self.busy = busy or {"error": f"the server is busy: {max_in_progress} requests are in progress; retry after "
                                      f"{limits.retry_after_s} s", "limit": "max_in_progress", "max": max_in_progress}
        # touched only on the event loop's thread (begin_stop: uvicorn's signal handler, which runs there too)
        self.guarded_in_progress = 0
        self.requests_in_progress = 0
        self.refused = 0  # requests answered 503 because `max_in_progress` were in progress
        self.last_request_s = 0.0  # time.monotonic() of the last request's start or end
        self.stopping_since: float | None = None
        self.cancelled = False

    def begin_stop(self) -> None:
        """Refuse new requests (503, Retry-After) from now on; `drained` tells when to close."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def drained(self, now: float | None = None) -> bool:
        """Whether a stopping server may close its listening socket: no request in progress and none for
        `DRAIN_QUIET_S` since the stop began, or the shutdown grace spent (then the app is asked to cancel what
        is still in progress)."""
        if self.stopping_since is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self.stopping_since >= self.limits.shutdown_grace_s:
            if self.requests_in_progress and self.cancel_in_flight is not None and not self.cancelled:
                self.cancelled = True
                self.cancel_in_flight()
            return True
        quiet_since = max(self.last_request_s, self.stopping_since)
        return self.requests_in_progress == 0 and now - quiet_since >= DRAIN_QUIET_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self.websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.requests_in_progress += 1
        self.last_request_s = time.monotonic()
        try:
            if self.stopping_since is not None:
                await send_json(send, 503, {"error": f"the server is stopping; retry after "
                                                     f"{self.limits.retry_after_s} s", "limit": "shutdown"},
                                retry_after_s=self.limits.retry_after_s)
            elif self.guarded_methods is not None and scope["method"] not in self.guarded_methods:
                await self.app(scope, receive, send)
            else:
                await self._guarded(scope, receive, send)
        finally:
            self.requests_in_progress -= 1
            self.last_request_s = time.monotonic()

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket connection: refused (a server with sessions overrides this)."""
        if (await receive())["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": 1003})

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A request whose body is read whole and checked, then handed to the app within the cap. The cap counts
        only requests read whole: a client still sending holds a coroutine and its connection, nothing else."""
        try:
            body = await self._read_body(scope, receive)
        except BodyError as exc:
            limit = {408: "body_timeout_s", 413: "max_body_bytes"}.get(exc.status)
            await send_json(send, exc.status, {"error": str(exc), **({"limit": limit} if limit else {})})
            return
        if body is None:  # the client went away
            return
        if self.guarded_in_progress >= self.max_in_progress:
            self.refused += 1
            await send_json(send, 503, self.busy, retry_after_s=self.limits.retry_after_s)
            return
        self.guarded_in_progress += 1
        watcher, token = None, None
        if self.watch_disconnect:
            gone = threading.Event()
            watcher = asyncio.ensure_future(_watch_disconnect(receive, gone))
            token = _client_alive.set(lambda: not gone.is_set())  # a2wsgi runs the app in a copy of this context
        # The app sees the body as read: a chunked one with its length (a WSGI app reads up to Content-Length)
        headers = [(name, value) for name, value in scope["headers"]
                   if name not in (b"content-length", b"transfer-encoding")]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        try:
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.guarded_in_progress -= 1
            if watcher is not None and token is not None:
                watcher.cancel()
                _client_alive.reset(token)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or BodyError (408 late, 413 over the limit, 400 for JSON our servers refuse when
        `check_json`); None on a disconnect. A declared length over the limit is refused before a byte is read."""
        limit = self.limits.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            raise BodyError(f"the body is {int(declared)} bytes; at most {limit} are accepted", 413)
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - loop.time())
            except TimeoutError:
                raise BodyError(f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                                408) from None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyError(f"the body is over {limit} bytes; at most {limit} are accepted", 413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if self.check_json and body.strip():
            parse_json_text(body)
        return body


def wsgi_host(app: Any, limits: HTTPLimits, *, cancel_in_flight: Callable[[], None] | None = None) -> GuardedHTTP:
    """The WSGI `app` behind the guards, answered by `limits.workers` threads with up to `limits.max_pending`
    requests (read whole) waiting for one."""
    from a2wsgi import WSGIMiddleware

    busy = {"error": f"the server is busy: {limits.workers} requests are being answered and {limits.max_pending} "
                     f"wait; retry after {limits.retry_after_s} s", "limit": "max_pending", "max": limits.max_pending}
    return GuardedHTTP(WSGIMiddleware(app, workers=limits.workers), limits, max_in_progress=limits.max_in_progress,
                       cancel_in_flight=cancel_in_flight, busy=busy, lifespan=False, watch_disconnect=True)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (0 = a free port): connections queue from now on, before the server
    runs, so a client that learns the address may connect at once."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def build_server(app: GuardedHTTP, **config: Any) -> Any:
    """The uvicorn server of `app`, with its limits: the connection cap and the head deadline
    (`connection_protocol`), the graceful-shutdown wait, and the drain before it (a first SIGINT or SIGTERM starts
    `app.begin_stop`; uvicorn's own shutdown begins once `app.drained()`, a second signal begins it at once).
    `config` goes to uvicorn.Config. Run it with `.run(sockets=[bind(...)])`; `.should_exit = True` stops it at
    once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)  # uvicorn records the signal, to raise it again once it has stopped
            if app.stopping_since is None:
                app.begin_stop()
                self.should_exit = False  # not yet: on_tick starts the shutdown once the server has drained

        async def on_tick(self, counter: int) -> bool:
            if app.stopping_since is not None and not self.should_exit and app.drained():
                self.should_exit = True
            return bool(await super().on_tick(counter))

    limits = app.limits
    protocol = connection_protocol(limits.header_timeout_s, limits.max_connections, limits.retry_after_s,
                                   limits.max_body_bytes)
    settings: dict[str, Any] = {"http": protocol, "timeout_graceful_shutdown": max(1, round(limits.shutdown_grace_s)),
                                "log_level": "warning", "lifespan": "on" if app.lifespan else "off",
                                "ws_max_size": limits.max_body_bytes, **config}
    return DrainingServer(uvicorn.Config(app, **settings))


def serve(app: GuardedHTTP, host: str, port: int, banner: Callable[[str], str]) -> None:
    """Bind `host:port` (0 = a free port), print `banner(url)` with the bound address, serve until SIGINT or
    SIGTERM, then return after the drain and uvicorn's graceful shutdown."""
    sock = bind(host, port)
    server = build_server(app)
    previous = stop_on_sigint_and_sigterm()  # SIGINT may arrive ignored (a background shell): set it again
    try:
        print(banner(f"http://{host}:{sock.getsockname()[1]}"), flush=True)
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        # uvicorn catches the signal, shuts down, restores our handler and raises the signal again (so that a
        # process stopped by SIGTERM looks stopped by it); ours turns that into this exception, and a clean exit.
        pass
    finally:
        sock.close()
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


class BackgroundServer:
    """A guarded app served by uvicorn on a thread of its own. The socket is bound in the constructor, so `url`
    is known and connections queue before `start()`; `stop()` drains as a signal would, then waits for the thread."""

    def __init__(self, app: GuardedHTTP, host: str = "127.0.0.1", port: int = 0, name: str = "http-server") -> None:
        self.app = app
        self._sock = bind(host, port)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        self.server = build_server(app)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._sock]}, name=name,
                                        daemon=True)

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self.app.begin_stop()
            deadline = time.monotonic() + timeout_s
            while not self.app.drained() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.server.should_exit = True
            self._thread.join(timeout=timeout_s)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
