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
- at most `--max-sessions` (32: a GRPO group of 8 four times over) WebSocket sessions (one more always gets the
  CAPACITY_REACHED error and is closed; our client waits and retries) and as many plain-HTTP POSTs in progress
  (one more: 503 with Retry-After); a session that sends nothing within `--handshake-timeout` (10 s) of connecting,
  or is idle for `--session-timeout` (600 s), is told so and ended, and its slot is free again; `--max-connections` (256)
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
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentgym_opsd.integrations.openenv_guards import SessionGate, guard_session, refuse_session
from agentgym_opsd.registry import RegistryError, import_user_module, make, parse_env_spec
from agentgym_opsd.serving import (
    add_limit_arguments,
    limits_from_args,
    non_negative_int,
    port_number,
    positive_float,
    positive_int,
)
from agentgym_opsd.serving.host import (
    DRAIN_QUIET_S,
    ConnectionLimits,
    GuardedHTTP,
    bind,
    build_server,
    serve,
)

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
class ServerLimits(ConnectionLimits):
    """What one OpenEnv server accepts at once: the host's limits (`serving.host.ConnectionLimits`) and its
    sessions'."""

    max_body_bytes: int = MAX_BODY_BYTES
    """The largest POST body and WebSocket message."""
    max_connections: int = 256
    """Open connections of any kind (sessions, requests, idle keep-alive ones); must exceed max_sessions."""
    max_sessions: int = 32
    """WebSocket sessions (each owns an environment instance), and plain-HTTP POSTs in progress."""
    session_timeout_s: float = 600.0
    """Seconds a session may sit idle before it is ended (its client's slot is freed)."""
    handshake_timeout_s: float = 10.0
    """Seconds a new WebSocket session may take to send its first message; then it is told so and ended."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_connections <= self.max_sessions:
            raise ValueError(f"ServerLimits.max_connections ({self.max_connections}) must exceed max_sessions "
                             f"({self.max_sessions}): every session holds a connection")


class GuardedApp(GuardedHTTP):
    """OpenEnv's FastAPI app (`app`) behind the host's guards on its POSTs (`serving.host.GuardedHTTP`: the body
    limit and deadline, hostile JSON, at most `max_sessions` POSTs in progress). A WebSocket session goes through
    `openenv_guards.guard_session` (the session cap, the idle timeout, the message checks; uvicorn bounds a
    message's size, `ws_max_size`); lifespan traffic passes straight through. `begin_stop` starts the drain:
    new requests and sessions are refused, and `drained` says when the listening socket may close."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        super().__init__(app, limits, max_in_progress=limits.max_sessions, guarded_methods=frozenset({"POST"}),
                         check_json=True, busy={"error": f"the server is busy: {limits.max_sessions} requests are in "
                                                         f"progress; retry after {limits.retry_after_s} s",
                                                "limit": "max_sessions", "max": limits.max_sessions})
        self.sessions = SessionGate(limits.max_sessions)

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        from starlette.websockets import WebSocketDisconnect

        if self.stopping_since is not None:
            await refuse_session(receive, send, "the server is stopping; connect again later", "SERVER_STOPPING",
                                 close_code=1012)  # "service restart"
            return
        try:
            await guard_session(self.app, self.sessions, self.limits.session_timeout_s, scope, receive, send,
                                handshake_timeout_s=self.limits.handshake_timeout_s)
        except WebSocketDisconnect:
            # OpenEnv's /ws handler closes the socket when a session ends and expects only RuntimeError from that
            # close; a client that closed first makes it raise this instead, which uvicorn would log as a crash
            # of the application. The session is over either way (OpenEnv destroyed it before closing).
            pass


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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="agentgym-opsd serve-openenv", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("env", help="a registered environment, optionally with a split (ALFWorld-v0:easy)")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=port_number, default=8000, help="port to bind (0 = any free port)")
    ap.add_argument("--max-sessions", type=positive_int, default=ServerLimits.max_sessions,
                    help="WebSocket sessions at once, and plain-HTTP POSTs in progress (default %(default)s)")
    ap.add_argument("--handshake-timeout", type=positive_float, default=ServerLimits.handshake_timeout_s,
                    help="seconds a new session may take to send its first message (default %(default)s)")
    ap.add_argument("--session-timeout", type=positive_float, default=ServerLimits.session_timeout_s,
                    help="seconds an idle session lives (default %(default)s)")
    ap.add_argument("--max-body-bytes", type=positive_int, default=ServerLimits.max_body_bytes,
                    help="largest POST body or WebSocket message (default %(default)s)")
    add_limit_arguments(ap, ServerLimits())
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
        limits = limits_from_args(args, ServerLimits(), max_sessions=args.max_sessions,
                                  session_timeout_s=args.session_timeout, handshake_timeout_s=args.handshake_timeout,
                                  max_body_bytes=args.max_body_bytes)
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
