"""The OpenEnv server's guards around OpenEnv's app and uvicorn: what our WSGI servers get from the serving kit's
connection layer (`agentgym_opsd.serving.connections`), for an ASGI server with WebSocket sessions.

- `connection_protocol`: uvicorn's h11 protocol with a deadline on each request head (an idle or trickling
  client gets a JSON 408 and is closed: uvicorn has none, and 64 idle sockets held every connection slot), a cap
  on open connections answered with a JSON 503 (uvicorn's own is plain text), and JSON for h11's refusals;
- `guard_session`: one WebSocket session. At most `max_sessions` at once (one more always gets OpenEnv's
  `CAPACITY_REACHED` error, then a close); a session idle for `session_timeout_s` is told so and ended, which
  frees its slot (OpenEnv 0.3 takes the timeout in its config and never applies it); each message passes the
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
from agentgym_opsd.serving.connections import json_response

__all__ = ["SessionGate", "connection_protocol", "guard_session", "refuse_session"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def connection_protocol(header_timeout_s: float, max_connections: int, retry_after_s: int, max_body_bytes: int) -> type:
    """A uvicorn h11 protocol class (uvicorn.Config(http=...)) with the head deadline, the connection cap and a
    413 at once for a chunk whose declared size is over `max_body_bytes` (the app sees only the bytes that
    arrived, so such a chunk trickled would otherwise wait for the body deadline)."""
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

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.write(too_many)
                transport.close()
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            upgraded = self.transport.get_protocol() is not self  # a WebSocket now owns the connection
            if self._head_timer is not None and (upgraded or self.cycle is not self._waiting_cycle):
                self._disarm()  # the head arrived: the app reads the body within its own deadline
            # h11 keeps the size still to come of the chunk being read (a private field: absent, nothing is checked)
            chunk_left = getattr(getattr(self.conn, "_reader", None), "_bytes_in_chunk", 0)
            if not upgraded and isinstance(chunk_left, int) and chunk_left > max_body_bytes:
                self.transport.write(too_large)
                self.transport.close()  # the app's read of the body sees a disconnect and answers nothing

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # a keep-alive connection waits for its next head under the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            body = json.dumps({"error": msg}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

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
                self.transport.write(too_slow)
                self.transport.close()

    return GuardedH11Protocol


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
                        scope: Message, receive: Receive, send: Send) -> None:
    """Run OpenEnv's WebSocket handler `app` for one connection, with the gate, the idle timeout and the message
    checks of the module docstring."""
    if gate.open >= gate.max_sessions:
        # Answered here, before OpenEnv creates anything, so every connection over the cap hears why.
        await refuse_session(receive, send, f"the server holds {gate.max_sessions} sessions already; retry later",
                             "CAPACITY_REACHED", close_code=1013,  # "try again later"
                             active_sessions=gate.open, max_sessions=gate.max_sessions)
        return

    async def checked_receive() -> Message:
        while True:
            try:
                message = await asyncio.wait_for(receive(), session_timeout_s)
            except TimeoutError:
                await send(_error(f"the session was idle for {session_timeout_s:g} s and is closed",
                                  "SESSION_TIMEOUT"))
                return {"type": "websocket.disconnect", "code": 1000}  # OpenEnv frees the session, then closes
            if message["type"] != "websocket.receive":
                return message
            reason = _refusal(message)
            if reason is None:
                return message
            await send(_error(reason, "INVALID_JSON"))

    gate.open += 1
    try:
        await app(scope, checked_receive, send)
    finally:
        gate.open -= 1
