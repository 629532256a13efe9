"""One of our environments behind OpenEnv's own server: `agentgym-opsd serve-openenv ENV[:SPLIT] --port P`.

    agentgym-opsd serve-openenv ALFWorld-v0:easy --port 8000            # plays over ws://127.0.0.1:8000/ws
    agentgym-opsd serve-openenv WebShop-v0 --max-sessions 16 --oracle   # + the expert's next action
    agentgym-opsd serve-openenv Lights-v0 --import my_envs.py           # a plugin environment

The app is OpenEnv's (`create_app` of openenv-core 0.3) over `openenv_env.AgentGymEnvironment`:
WebSocket sessions at /ws, one environment each (what OpenEnv's `EnvClient` and our `AgentGymEnvClient` play
episodes over); OpenEnv's stateless POST /reset and /step (a fresh session per request: /reset shows a first
observation, /step has no episode to play and says so); GET /health, /metadata, /schema, /state. With `--web`
(OpenEnv's switch ENABLE_WEB_INTERFACE=true) OpenEnv's web playground is at /web: one environment that a person
plays with Reset and Step buttons (`--seed N` makes its first Reset task N's seed).

Around it, the hardening of our other servers:
- a POST body over `--max-body-bytes` (1 MiB) gets 413, a WebSocket message over it closes the session (1009);
- malformed JSON (not UTF-8, NaN, nesting deeper than 32, a lone surrogate) gets 400 `{"error"}` from the
  checks our other servers apply (`serving.bodies`); unknown reset or step fields, a task that does not
  exist, a step with no episode get 400 (over the WebSocket: an error message, the session goes on); an action
  of the wrong shape gets OpenEnv's 422;
- a WebSocket message must be a JSON object with a string "type" and pass the same checks (nesting, NaN, lone
  surrogates): `[1,2]`, `null`, `5`, a binary frame get an error message, the session goes on (`openenv_guards`);
- at most `--max-sessions` (8) WebSocket sessions (one more always gets the CAPACITY_REACHED error and is
  closed) and as many plain-HTTP POSTs in progress (one more: 503 with Retry-After); a session idle for
  `--session-timeout` (600 s) is told so and ended, and its slot is free again; `--max-connections` (64)
  bounds open connections of any kind (one more: a JSON 503); a request head that takes over
  `--header-timeout` (10 s), or a POST body over `--body-timeout` (30 s), gets a JSON 408;
- an unknown environment or split is a usage error at startup (exit 2) that lists what exists;
- SIGINT or SIGTERM stops it in two stages, as our other servers stop: first it drains (every new request gets
  a JSON 503 with Retry-After, a new WebSocket session the SERVER_STOPPING error, requests in progress end),
  and once no request has been in progress for `DRAIN_QUIET_S` (or `--shutdown-grace`, 5 s, has passed) it
  stops listening, closes the sessions and exits 0. Closing the listening socket at once would reset whatever
  connections the kernel had queued but the server not yet accepted: requests lost, not refused; drained, the
  clients told to retry are waiting when it closes. A second signal stops it at once. It binds 127.0.0.1
  unless told otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from agentgym_opsd.integrations.openenv_guards import (
    SessionGate,
    connection_protocol,
    guard_session,
    refuse_session,
)
from agentgym_opsd.registry import RegistryError, import_user_module, make, parse_env_spec
from agentgym_opsd.serving import (
    BodyError,
    non_negative_int,
    parse_json_text,
    port_number,
    positive_float,
    positive_int,
    stop_on_sigint_and_sigterm,
)
from agentgym_opsd.serving.pool import DRAIN_QUIET_S

if TYPE_CHECKING:
    from agentgym_opsd.integrations.openenv_env import SessionSettings

# OpenEnv (and `openenv_env`, which builds on it) is imported where it is used: its server package imports gradio,
# seconds that `serve-openenv --help` and a usage error need not wait for.

__all__ = ["DRAIN_QUIET_S", "MAX_BODY_BYTES", "GuardedApp", "ServerLimits", "bind", "build_server", "create_app",
           "main", "serve", "session_class"]

MAX_BODY_BYTES = 1024 * 1024
"""A reply is at most `MAX_REPLY_CHARS` (100,000) characters, up to 12 bytes each when JSON-escaped: room for it."""

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class ServerLimits:
    """What one server accepts at once, and how large a request may be."""

    max_sessions: int = 8
    """WebSocket sessions (each owns an environment instance), and plain-HTTP POSTs in progress."""
    session_timeout_s: float = 600.0
    """Seconds a session may sit idle before it is ended (its client's slot is freed)."""
    max_body_bytes: int = MAX_BODY_BYTES
    """The largest POST body and WebSocket message."""
    max_connections: int = 64
    """Open connections of any kind (sessions, requests, idle keep-alive ones); must exceed max_sessions."""
    header_timeout_s: float = 10.0
    """Seconds from a connection's accept (or its previous answer) to the end of its request head; then 408."""
    body_timeout_s: float = 30.0
    """Seconds a POST body may take to arrive once its head has; then 408."""
    retry_after_s: int = 1
    """The Retry-After of a 503."""
    shutdown_grace_s: float = 5.0
    """Seconds the requests in progress at a stop may take to end."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = (int, float) if f.name.endswith("_s") else (int,)
            if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < float("inf"):
                what = "a finite number of seconds > 0" if f.name.endswith("_s") else "an integer >= 1"
                raise ValueError(f"ServerLimits.{f.name} must be {what}, got {value!r}")
        if self.max_connections <= self.max_sessions:
            raise ValueError(f"ServerLimits.max_connections ({self.max_connections}) must exceed max_sessions "
                             f"({self.max_sessions}): every session holds a connection")


class GuardedApp:
    """OpenEnv's FastAPI app (`app`) behind the checks of its plain-HTTP requests: the body limit, hostile JSON,
    the cap on POSTs in progress, the body deadline. A WebSocket session goes through `openenv_guards.guard_session`
    (the session cap, the idle timeout, the message checks; uvicorn bounds a message's size, `ws_max_size`);
    lifespan traffic passes straight through. `begin_stop` starts the drain: new requests and sessions are
    refused, and `drained` says when the listening socket may close."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits
        # touched only on the event loop's thread (begin_stop: its signal handler, which runs there too)
        self.posts_in_progress = 0
        self.requests_in_progress = 0
        self.last_request_s = 0.0  # time.monotonic() of the last request's start or end
        self.stopping_since: float | None = None
        self.sessions = SessionGate(limits.max_sessions)

    def begin_stop(self) -> None:
        """Refuse new requests (503, Retry-After) and sessions from now on; `drained` tells when to close."""
        if self.stopping_since is None:
            self.stopping_since = time.monotonic()

    def drained(self, now: float | None = None) -> bool:
        """Whether a stopping server may close its listening socket: no request in progress and none for
        `DRAIN_QUIET_S` since the stop began, or the shutdown grace spent."""
        if self.stopping_since is None:
            return False
        now = time.monotonic() if now is None else now
        if now - self.stopping_since >= self.limits.shutdown_grace_s:
            return True
        quiet_since = max(self.last_request_s, self.stopping_since)
        return self.requests_in_progress == 0 and now - quiet_since >= DRAIN_QUIET_S

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._session(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.requests_in_progress += 1
        self.last_request_s = time.monotonic()
        try:
            if self.stopping_since is not None:
                await _send_json(send, 503, {"error": f"the server is stopping; retry after "
                                                      f"{self.limits.retry_after_s} s", "limit": "shutdown"},
                                 retry_after_s=self.limits.retry_after_s)
            elif scope["method"] != "POST":
                await self.app(scope, receive, send)
            else:
                await self._post(scope, receive, send)
        finally:
            self.requests_in_progress -= 1
            self.last_request_s = time.monotonic()

    async def _post(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A POST within the cap on POSTs in progress, its body read whole and checked before the app sees it."""
        if self.posts_in_progress >= self.limits.max_sessions:
            await _send_json(send, 503, {"error": f"the server is busy: {self.limits.max_sessions} requests are in "
                                                  f"progress; retry after {self.limits.retry_after_s} s",
                                         "limit": "max_sessions", "max": self.limits.max_sessions},
                             retry_after_s=self.limits.retry_after_s)
            return
        self.posts_in_progress += 1
        try:
            try:
                body = await self._read_body(scope, receive)
            except BodyError as exc:
                await _send_json(send, exc.status, {"error": str(exc)})
                return
            if body is None:  # the client went away
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            self.posts_in_progress -= 1

    async def _session(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.websockets import WebSocketDisconnect

        if self.stopping_since is not None:
            await refuse_session(receive, send, "the server is stopping; connect again later", "SERVER_STOPPING",
                                 close_code=1012)  # "service restart"
            return
        try:
            await guard_session(self.app, self.sessions, self.limits.session_timeout_s, scope, receive, send)
        except WebSocketDisconnect:
            # OpenEnv's /ws handler closes the socket when a session ends and expects only RuntimeError from that
            # close; a client that closed first makes it raise this instead, which uvicorn would log as a crash
            # of the application. The session is over either way (OpenEnv destroyed it before closing).
            pass

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or BodyError (413 over the limit, 400 for JSON our servers refuse); None on a
        disconnect. A declared length over the limit is refused before a byte is read."""
        limit = self.limits.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            raise BodyError(f"the body is {int(declared)} bytes; at most {limit} are accepted", 413)
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
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
        if body.strip():  # an empty /reset body is OpenEnv's default reset
            parse_json_text(body)
        return body


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then the connection's own messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _send_json(send: Send, status: int, body: dict[str, Any], *, retry_after_s: int | None = None) -> None:
    data = json.dumps(body).encode()
    # a refusal closes the connection: the rest of a body it did not read would be taken for the next request
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
               (b"connection", b"close")]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


def create_app(settings: SessionSettings, limits: ServerLimits | None = None) -> GuardedApp:
    """The ASGI app serving `settings.env_spec`: OpenEnv's `create_app`, so OpenEnv's own switch
    `ENABLE_WEB_INTERFACE=true` (`serve-openenv --web`) adds its web playground at /web. The environment is made
    once here, so an unknown id, split or argument fails now (RegistryError / ValueError), not in the first
    session."""
    limits = limits or ServerLimits()
    make(settings.env_spec, **({"max_turns": settings.max_turns} if settings.max_turns else {})).close()
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import create_app as openenv_create_app
    from openenv.core.env_server.types import ConcurrencyConfig

    from agentgym_opsd.integrations.openenv_env import AgentAction, AgentObservation, BadRequest

    env_id, split = parse_env_spec(settings.env_spec)
    title = f"{env_id}" + (f" (split {split})" if split else "")
    app = openenv_create_app(session_class(settings), AgentAction, AgentObservation, env_name=title,
                             concurrency_config=ConcurrencyConfig(max_concurrent_envs=limits.max_sessions,
                                                                  session_timeout=limits.session_timeout_s))

    async def bad_request(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    app.add_exception_handler(BadRequest, bad_request)
    app.title = f"OpenEnv: {title}"
    return GuardedApp(app, limits)


def session_class(settings: SessionSettings) -> type:
    """`AgentGymEnvironment` bound to `settings`, as a class OpenEnv builds with no arguments: its web playground
    instantiates only a class or a function (a `functools.partial` it would take for an environment), and its
    server reads SUPPORTS_CONCURRENT_SESSIONS off a class instead of building a throwaway instance to ask."""
    from agentgym_opsd.integrations.openenv_env import AgentGymEnvironment

    class BoundEnvironment(AgentGymEnvironment):
        def __init__(self) -> None:
            super().__init__(settings)

    return BoundEnvironment


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (0 = a free port): connections queue from now on, before the server
    runs, so a client that learns the address may connect at once."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def build_server(app: GuardedApp) -> Any:
    """The uvicorn server of `app`, with its limits: the WebSocket message bound, the connection cap and the head
    deadline (`openenv_guards.connection_protocol`), the graceful-shutdown wait, and the drain before it (a first
    SIGINT or SIGTERM starts `app.begin_stop`; uvicorn's own shutdown begins once `app.drained()`, a second signal
    begins it at once). Run it with `.run(sockets=[bind(...)])`; `.should_exit = True` stops it at once."""
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
    config = uvicorn.Config(app, http=protocol, ws_max_size=limits.max_body_bytes,
                            timeout_graceful_shutdown=max(1, round(limits.shutdown_grace_s)), log_level="warning",
                            lifespan="on")
    return DrainingServer(config)


def serve(app: GuardedApp, host: str, port: int, banner: Callable[[str], str]) -> None:
    """Bind `host:port` (0 = a free port), print `banner(url)` with the bound address, serve until SIGINT or
    SIGTERM, then return after uvicorn's graceful shutdown."""
    sock = bind(host, port)
    server = build_server(app)
    previous = stop_on_sigint_and_sigterm()  # as our other servers do
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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="agentgym-opsd serve-openenv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("env", help="a registered environment, optionally with a split (ALFWorld-v0:easy)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=port_number, default=8000, help="port to bind (0 = any free port)")
    ap.add_argument("--max-sessions", type=positive_int, default=ServerLimits.max_sessions,
                    help="WebSocket sessions at once, and plain-HTTP POSTs in progress (default %(default)s)")
    ap.add_argument("--session-timeout", type=positive_float, default=ServerLimits.session_timeout_s,
                    help="seconds an idle session lives (default %(default)s)")
    ap.add_argument("--max-body-bytes", type=positive_int, default=ServerLimits.max_body_bytes,
                    help="largest POST body or WebSocket message (default %(default)s)")
    ap.add_argument("--max-connections", type=positive_int, default=ServerLimits.max_connections,
                    help="open connections of any kind (default %(default)s)")
    ap.add_argument("--header-timeout", type=positive_float, default=ServerLimits.header_timeout_s,
                    help="seconds a client may take to send a request head; then 408 (default %(default)s)")
    ap.add_argument("--body-timeout", type=positive_float, default=ServerLimits.body_timeout_s,
                    help="seconds a POST body may take once its head has arrived; then 408 (default %(default)s)")
    ap.add_argument("--shutdown-grace", type=positive_float, default=ServerLimits.shutdown_grace_s,
                    help="seconds requests in progress get to end at a stop (default %(default)s)")
    ap.add_argument("--max-turns", type=non_negative_int, default=0,
                    help="turn limit of an episode (default 0: the environment's own)")
    ap.add_argument("--skill-context", action="store_true",
                    help="send each task's skill context c+ in the observation (privileged: a self-teacher's)")
    ap.add_argument("--oracle", action="store_true",
                    help="send the expert's next action in the observation (privileged: demonstrations, tests)")
    ap.add_argument("--seed", type=non_negative_int, default=None,
                    help="the seed of a session's first reset that names no seed or task (the web playground's)")
    ap.add_argument("--web", action="store_true",
                    help="add OpenEnv's web playground at /web (= ENABLE_WEB_INTERFACE=true, OpenEnv's own switch)")
    ap.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                    help="a .py file or module that registers environments (repeatable)")
    args = ap.parse_args(argv)
    from agentgym_opsd.integrations.openenv_env import SessionSettings

    try:
        for spec in args.imports:
            import_user_module(spec)
        limits = ServerLimits(max_sessions=args.max_sessions, session_timeout_s=args.session_timeout,
                              max_body_bytes=args.max_body_bytes, max_connections=args.max_connections,
                              header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                              shutdown_grace_s=args.shutdown_grace)
        settings = SessionSettings(args.env, max_turns=args.max_turns, skill_context=args.skill_context,
                                   oracle=args.oracle, seed=args.seed)
        if args.web:
            os.environ["ENABLE_WEB_INTERFACE"] = "true"  # OpenEnv's create_app reads its switch from there
        app = create_app(settings, limits)
    except (RegistryError, ValueError) as exc:
        ap.error(str(exc))
    env_id, split = parse_env_spec(args.env)
    where = f"{env_id}" + (f" (split {split})" if split else "")
    web = os.environ.get("ENABLE_WEB_INTERFACE", "").lower() in ("true", "1", "yes")  # OpenEnv's own test of it
    serve(app, args.host, args.port,
          lambda url: f"OpenEnv server for {where} on {url} (sessions: {url.replace('http', 'ws', 1)}/ws"
                      + (f"; playground: {url}/web/)" if web else ")"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
