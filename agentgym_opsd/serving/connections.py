"""The connection thread of `pool.PooledWSGIServer`: it reads every request whole before a worker takes it, and
closes refused connections once their client has stopped sending.

A worker that read its own request waited for its client: 33 connections that sent nothing, or trickled
their headers a byte at a time, held all 32 workers of the retrieval server, and a one-query request waited
29 s behind them (forever, for the tricklers). Here one thread reads all connections at once (non-blocking
sockets under a selector) and a worker gets a request only once its head and body have arrived, so an idle
client costs a socket and a buffer, never a worker. What this thread enforces:

- the request head (request line and headers) arrives within `header_timeout_s` of the accept and is at most
  MAX_HEAD_BYTES, the body within `body_timeout_s` of the head's end; otherwise the client gets a JSON 408
  (431 for an oversize head) and the connection is closed. The deadlines are totals, not per read, so a
  trickle of bytes does not extend them;
- a body larger than `max_body_bytes`, by its Content-Length or by a chunk size, gets a JSON 413 as soon as
  the head or that chunk's size line has arrived (not a 408 once the body deadline has passed);
- at most `max_reading` connections are read at once; one more is refused with a JSON 503 at once;
- once the server is stopping (`begin_stop`), every connection, arriving or still being read, gets a JSON 503
  with Retry-After at once (a refused connection would look like a crashed server);
- a request read whole joins the workers' queue (`offer`); when that queue is full it is refused with the
  server's busy 503.

A body is read ahead up to `read_ahead_bytes` (head included); the rest of a longer one is read by the worker
through `ReadAhead`, still within the body deadline, so even then a slow client holds a worker for at most
`body_timeout_s`. Refused and timed-out connections get their answer and are drained of what their client
still sends, for up to `linger_s`, before they are closed: closing a socket with unread bytes resets the
connection, and the client would see the reset instead of the answer.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import itertools
import json
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LINGER_CAPACITY", "MAX_HEAD_BYTES", "ConnectionReader", "ReadAhead", "json_response"]

MAX_HEAD_BYTES = 64 * 1024
"""The longest request head (request line and headers) read; http.server refuses a longer line anyway."""
LINGER_CAPACITY = 256
"""Answered connections that may be drained at once (a well-behaved client is done within a millisecond of
its answer; this bounds the sockets that slow ones hold open); beyond it one is closed at once."""
_RECV_BYTES = 64 * 1024
_MAX_SELECT_S = 1.0  # how long the thread sleeps at most with no deadline due: it also checks for a stop


def json_response(status: int, reason: str, body: dict[str, Any], retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.0 answer with a JSON body, for the answers sent without a worker (408, 431, 503)."""
    data = json.dumps(body).encode()
    retry = f"Retry-After: {retry_after_s}\r\n" if retry_after_s is not None else ""
    head = (f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"{retry}Connection: close\r\n\r\n")
    return head.encode("ascii") + data


class ReadAhead(io.RawIOBase):
    """A request's bytes as its handler reads them: those the connection thread read ahead, then the socket's.
    A socket read waits at most `read_timeout_s`, and none goes past `deadline` (time.monotonic; then
    TimeoutError, which Werkzeug takes for a dropped connection): a slow body cannot hold the worker longer."""

    def __init__(self, data: bytes, sock: socket.socket, deadline: float, read_timeout_s: float) -> None:
        super().__init__()
        self._data = data
        self._offset = 0
        self._sock = sock
        self._deadline = deadline
        self._read_timeout_s = read_timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._offset < len(self._data):
            count = min(len(buffer), len(self._data) - self._offset)
            buffer[:count] = self._data[self._offset:self._offset + count]
            self._offset += count
            return count
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request body did not arrive within its deadline")
        self._sock.settimeout(min(left, self._read_timeout_s))
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._read_timeout_s)  # what the worker's writes expect


def _head_end(buffer: bytearray, start: int) -> int | None:
    """Where the request head ends (after its empty line; bare LF line ends are accepted, as http.server
    does), searching from `start` (bytes before it were searched already: a head arriving a byte at a time
    is scanned once, not once a byte)."""
    ends = [i + skip for mark, skip in ((b"\n\r\n", 3), (b"\n\n", 2)) if (i := buffer.find(mark, start)) >= 0]
    return min(ends) if ends else None


def _body_framing(head: bytes) -> tuple[bool, int | None]:
    """(chunked, Content-Length) as the head declares them; a missing or unreadable length is None (a worker
    then reads what there is and Werkzeug answers a malformed request as it always does)."""
    chunked, length = False, None
    for line in head.splitlines()[1:]:
        name, found, value = line.partition(b":")
        if not found:
            continue
        name = name.strip().lower()
        if name == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
        elif name == b"content-length":
            with contextlib.suppress(ValueError):
                length = int(value.strip())
    return chunked, length if length is not None and length >= 0 else None


class _BodyTooLarge(Exception):
    """A declared body size (Content-Length, or the chunk sizes so far) over the limit; `size` is that size."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def _scan_chunks(buffer: bytearray, pos: int, counted: int, max_bytes: int) -> tuple[int, int | None, int]:
    """Scan a chunked body from `pos`, the start of a chunk's size line, `counted` bytes of chunks before it:
    (where the first incomplete chunk starts, where the body ends or None while it has not all arrived, the
    bytes of the chunks before that start). A malformed size line ends the body there: the worker's Werkzeug
    refuses it. A size line taking the body over `max_bytes` raises _BodyTooLarge before its data arrives."""
    while True:
        eol = buffer.find(b"\r\n", pos)
        if eol < 0:
            return pos, None, counted
        try:
            size = int(bytes(buffer[pos:eol]).split(b";", 1)[0].strip(), 16)
        except ValueError:
            return pos, len(buffer), counted
        if size < 0:
            return pos, len(buffer), counted
        if counted + size > max_bytes:
            raise _BodyTooLarge(counted + size)
        if size == 0:  # the last chunk, then trailer lines up to an empty one
            end = buffer.find(b"\r\n\r\n", eol)
            return pos, end + 4 if end >= 0 else None, counted
        if eol + 2 + size + 2 > len(buffer):
            return pos, None, counted
        pos = eol + 2 + size + 2
        counted += size


@dataclass(eq=False)
class _Reading:
    """A connection whose request is still arriving."""

    sock: socket.socket
    address: Any
    deadline: float  # for the head, then for the body
    buffer: bytearray = field(default_factory=bytearray)
    head_end: int | None = None
    chunked: bool = False
    body_end: int | None = None  # known once the head is (Content-Length), or found by the chunk scan
    chunk_pos: int = 0
    chunk_bytes: int = 0  # data bytes of the chunks before chunk_pos


@dataclass(eq=False)
class _Lingering:
    """An answered connection drained until its client stops sending, or until `deadline`."""

    sock: socket.socket
    deadline: float


_STOP = object()
_BEGIN_STOP = object()


class ConnectionReader:
    """The one thread that reads requests and drains answered connections (see the module docstring).
    `offer(sock, address, read_ahead)` hands a request read whole to the workers' queue and says whether it
    was taken; `busy` is the answer when it was not. `pool` is the server's `WorkerPool`."""

    def __init__(self, pool: Any, offer: Callable[[socket.socket, Any, ReadAhead], bool], busy: bytes) -> None:
        self.pool = pool
        self._offer = offer
        self._busy = busy
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._deadlines: list[tuple[float, int, _Reading | _Lingering]] = []  # heap; stale entries are skipped
        self._order = itertools.count()
        self._reading: set[_Reading] = set()
        self._lingering: set[_Lingering] = set()
        self._stopping = False  # set by `begin_stop` (through the inbox): every connection is answered 503
        self.refused = 0  # connections answered 503 (max_reading or max_pending), written by this thread only
        self.timed_out = 0  # connections answered 408 or 431
        self._thread = threading.Thread(target=self._run, name="http-connections", daemon=True)
        self._thread.start()

    def reading(self) -> int:
        """Connections whose request is still arriving."""
        return len(self._reading)

    def holding(self) -> int:
        """Connections this thread holds: handed to it and not yet taken, being read, or answered and being
        drained."""
        return self._inbox.qsize() + len(self._reading) + len(self._lingering)

    def add(self, sock: socket.socket, address: Any) -> None:
        """From the accepting thread: read this connection's request (the thread never waits here)."""
        self._inbox.put((sock, address, time.monotonic()))
        self._wake()

    def begin_stop(self) -> None:
        """The server is stopping: from now on every connection, new or still being read, is answered 503 with
        Retry-After (and drained and closed as refused ones are), until `close`."""
        self._inbox.put(_BEGIN_STOP)
        self._wake()

    def close(self) -> None:
        """Stop the thread; it closes every connection it holds."""
        self._inbox.put(_STOP)
        self._wake()
        self._thread.join(timeout=10)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake-up pipe already wakes the thread
            self._wake_w.send(b"\0")

    # -- the thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                due = self._deadlines[0][0] - time.monotonic() if self._deadlines else _MAX_SELECT_S
                for key, _ in self._selector.select(min(max(due, 0.0), _MAX_SELECT_S)):
                    if key.data is None:
                        if not self._take_inbox():
                            return
                    elif isinstance(key.data, _Reading):
                        self._read(key.data)
                    else:
                        self._drain(key.data)
                self._expire(time.monotonic())
        finally:  # stopped: a request still arriving hears so (a reset would look like a crash), then all close
            stopping = self._stopping_response()
            for conn in [*self._reading, *self._lingering]:
                self._forget(conn)
                if isinstance(conn, _Reading):
                    with contextlib.suppress(OSError):
                        conn.sock.send(stopping)
                conn.sock.close()
            with contextlib.suppress(queue.Empty):
                while (item := self._inbox.get_nowait()) is not _STOP:
                    item[0].close()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _stopping_response(self) -> bytes:
        return json_response(503, "Service Unavailable", {"error": f"the server is stopping; retry after "
                                                                   f"{self.pool.retry_after_s} s"},
                             self.pool.retry_after_s)

    def _take_inbox(self) -> bool:
        """Start reading the newly accepted connections; False once told to stop."""
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if item is _STOP:
                return False
            if item is _BEGIN_STOP:
                self._stopping = True
                for conn in list(self._reading):
                    self._forget(conn)
                    self._answer(conn.sock, self._stopping_response())
                continue
            sock, address, accepted_at = item
            sock.setblocking(False)
            if self._stopping:
                self.refused += 1
                self._answer(sock, self._stopping_response())
                continue
            if len(self._reading) >= self.pool.max_reading:
                self.refused += 1
                self._answer(sock, json_response(
                    503, "Service Unavailable",
                    {"error": f"the server is reading {self.pool.max_reading} requests already; retry after "
                              f"{self.pool.retry_after_s} s", "limit": "max_reading", "max": self.pool.max_reading},
                    self.pool.retry_after_s))
                continue
            conn = _Reading(sock, address, accepted_at + self.pool.header_timeout_s)
            self._reading.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._schedule(conn)

    def _read(self, conn: _Reading) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset by the client
            data = b""
        if not data:  # the client gave up before its request was complete
            self._forget(conn)
            conn.sock.close()
            return
        searched = max(0, len(conn.buffer) - 2)  # an end mark may begin in the last two bytes already read
        conn.buffer += data
        if conn.head_end is None:
            conn.head_end = _head_end(conn.buffer, searched)
            if conn.head_end is None:
                if len(conn.buffer) > MAX_HEAD_BYTES:
                    self._refuse_late(conn, 431, "Request Header Fields Too Large",
                                      f"the request head is over {MAX_HEAD_BYTES} bytes", "max_head_bytes",
                                      MAX_HEAD_BYTES)
                return
            conn.chunked, length = _body_framing(bytes(conn.buffer[:conn.head_end]))
            if length is not None and length > self.pool.max_body_bytes:
                self._refuse_too_large(conn, length)
                return
            conn.chunk_pos = conn.head_end
            conn.body_end = None if conn.chunked else conn.head_end + (length or 0)
            conn.deadline = time.monotonic() + self.pool.body_timeout_s
            self._schedule(conn)
        if conn.chunked and conn.body_end is None:
            try:
                conn.chunk_pos, conn.body_end, conn.chunk_bytes = _scan_chunks(
                    conn.buffer, conn.chunk_pos, conn.chunk_bytes, self.pool.max_body_bytes)
            except _BodyTooLarge as exc:
                self._refuse_too_large(conn, exc.size)
                return
        complete = conn.body_end is not None and len(conn.buffer) >= conn.body_end
        if complete or len(conn.buffer) >= self.pool.read_ahead_bytes:
            self._hand_over(conn)

    def _hand_over(self, conn: _Reading) -> None:
        self._forget(conn)
        conn.sock.setblocking(True)
        read_ahead = ReadAhead(bytes(conn.buffer), conn.sock, conn.deadline, self.pool.request_timeout_s)
        if not self._offer(conn.sock, conn.address, read_ahead):
            self.refused += 1
            conn.sock.setblocking(False)
            self._answer(conn.sock, self._busy)

    def _drain(self, conn: _Lingering) -> None:
        try:
            data = conn.sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._forget(conn)
            conn.sock.close()

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(self._deadlines)
            if conn.deadline != deadline or (conn not in self._reading and conn not in self._lingering):
                continue  # stale: the connection moved on to another deadline, or is gone
            if isinstance(conn, _Lingering):
                self._forget(conn)
                conn.sock.close()
            elif conn.head_end is None:
                self._refuse_late(conn, 408, "Request Timeout", f"the request head did not arrive within "
                                  f"{self.pool.header_timeout_s:g} s", "header_timeout_s", self.pool.header_timeout_s)
            else:
                self._refuse_late(conn, 408, "Request Timeout", f"the request body did not arrive within "
                                  f"{self.pool.body_timeout_s:g} s", "body_timeout_s", self.pool.body_timeout_s)

    def _refuse_too_large(self, conn: _Reading, size: int) -> None:
        self._forget(conn)
        self.refused += 1
        limit = self.pool.max_body_bytes
        self._answer(conn.sock, json_response(413, "Content Too Large", {
            "error": f"the body is {size} bytes or more; at most {limit} are accepted", "limit": "max_body_bytes",
            "max": limit}))

    def _refuse_late(self, conn: _Reading, status: int, reason: str, message: str, limit: str, maximum: float) -> None:
        self._forget(conn)
        self.timed_out += 1
        self._answer(conn.sock, json_response(status, reason, {"error": message, "limit": limit, "max": maximum}))

    def _answer(self, sock: socket.socket, response: bytes) -> None:
        """Send `response` (a few hundred bytes: they fit in the socket's buffer, so this never waits), then
        drain the connection for up to `linger_s` before closing it."""
        try:
            sock.send(response)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone already
            sock.close()
            return
        if len(self._lingering) >= LINGER_CAPACITY:
            sock.close()
            return
        conn = _Lingering(sock, time.monotonic() + self.pool.linger_s)
        self._lingering.add(conn)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._schedule(conn)

    def _schedule(self, conn: _Reading | _Lingering) -> None:
        heapq.heappush(self._deadlines, (conn.deadline, next(self._order), conn))

    def _forget(self, conn: _Reading | _Lingering) -> None:
        """Stop watching `conn` (its socket stays open)."""
        self._reading.discard(conn)  # type: ignore[arg-type]
        self._lingering.discard(conn)  # type: ignore[arg-type]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
