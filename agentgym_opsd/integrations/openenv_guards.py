"""The OpenEnv server's guards on its WebSocket sessions (its HTTP requests and connections have the serving kit's
host guards, `agentgym_opsd.serving.host`, like every server we ship).

- `guard_session`: one WebSocket session. At most `max_sessions` at once (one more always gets OpenEnv's
  `CAPACITY_REACHED` error, then a close); a session that sends nothing within `handshake_timeout_s` of connecting,
  or is idle for `session_timeout_s`, is told so and ended, which frees its slot (OpenEnv 0.3 takes the timeout in its config and never applies it); each message passes the
  checks a POST body passes (`serving.bodies.parse_json_text`: nesting, NaN, lone surrogates) and must be a JSON
  object with a string "type": anything else (`[1,2]`, `null`, `5`, a binary frame) gets an error message
  naming what was wrong, with no Python internals, and the session goes on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from agentgym_opsd.serving.bodies import BodyError, parse_json_text

__all__ = ["SessionGate", "guard_session", "refuse_session"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class SessionGate:
    """The count of WebSocket sessions open now (touched only on the event loop's thread)."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.open = 0


def _error(message: str, code: str, **extra: Any) -> Message:
    """An OpenEnv error message (`WSErrorResponse`: {"type": "error", "data": {"message", "code", ...}})."""
    return {"type": "websocket.send", "text": json.dumps({"type": "error", "data": {"message": message, "code": code,
                                                                                   **extra}})}


def _refusal(message: Message) -> str | None:
    """Why a client's WebSocket message cannot reach OpenEnv's handler, or None when it may."""
    if message.get("text") is None:
        return "binary frames are not accepted; send JSON text"
    try:
        value = parse_json_text(message["text"].encode("utf-8", "surrogatepass"))
    except BodyError as exc:
        return str(exc)
    if not isinstance(value, dict):
        return f"a message must be a JSON object with a string \"type\", got {type(value).__name__}"
    if not isinstance(value.get("type"), str):
        return "a message must have a string \"type\" (reset, step, state, close)"
    return None


async def refuse_session(receive: Receive, send: Send, message: str, code: str, *, close_code: int,
                         **extra: Any) -> None:
    """Accept a WebSocket connection only to tell it, in OpenEnv's error message, why it gets no session, then
    close it with `close_code`."""
    if (await receive())["type"] != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send(_error(message, code, **extra))
    await send({"type": "websocket.close", "code": close_code})


async def guard_session(app: Any, gate: SessionGate, session_timeout_s: float,
                        scope: Message, receive: Receive, send: Send, *, handshake_timeout_s: float | None = None) -> None:
    """Run OpenEnv's WebSocket handler `app` for one connection, with the gate, the idle timeout and the message
    checks of the module docstring. A client that sends no message within `handshake_timeout_s` of connecting
    (default: the idle timeout) is told so and its session ended: a socket that opens a session and says nothing
    would otherwise hold its slot for the whole idle timeout."""
    if gate.open >= gate.max_sessions:
        # Answered here, before OpenEnv creates anything, so every connection over the cap hears why.
        await refuse_session(receive, send, f"the server holds {gate.max_sessions} sessions already; retry later",
                             "CAPACITY_REACHED", close_code=1013,  # "try again later"
                             active_sessions=gate.open, max_sessions=gate.max_sessions)
        return

    heard = False  # whether the client has sent a message yet

    async def checked_receive() -> Message:
        nonlocal heard
        while True:
            first = not heard and handshake_timeout_s is not None
            timeout_s = min(handshake_timeout_s, session_timeout_s) if first else session_timeout_s  # type: ignore[type-var]
            try:
                message = await asyncio.wait_for(receive(), timeout_s)
            except TimeoutError:
                why = (f"no message arrived within {timeout_s:g} s of connecting" if first
                       else f"the session was idle for {timeout_s:g} s")
                await send(_error(f"{why}; the session is closed", "SESSION_TIMEOUT"))
                return {"type": "websocket.disconnect", "code": 1000}  # OpenEnv frees the session, then closes
            if message["type"] != "websocket.receive":
                return message
            heard = True
            reason = _refusal(message)
            if reason is None:
                return message
            await send(_error(reason, "INVALID_JSON"))

    gate.open += 1
    try:
        await app(scope, checked_receive, send)
    finally:
        gate.open -= 1
