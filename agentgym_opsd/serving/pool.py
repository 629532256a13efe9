"""A WSGI server with a fixed pool of worker threads, for a server that must outlast a flood of connections.

Werkzeug's threaded server starts a thread per connection, so a flood of connections (or of clients that
never finish sending) starts threads without bound. `PooledWSGIServer` accepts connections on one thread
and hands each to one of `workers` threads through a queue of at most `max_pending` connections. A
connection that finds the queue full is refused at once, on the accepting thread, the way the policy
server refuses a request when its queue is full: a 503 with `Retry-After` and a JSON body
(`{"error", "limit": "max_pending", "max"}`), and the connection closed. The server never runs more than
the accepting thread, the workers and one thread that closes refused connections (`_Closer`).

Each connection carries one request (HTTP/1.0, `Connection: close`): with keep-alive an idle client would
hold a worker between its requests, and a few idle clients would hold them all. A read or write on a
connection that waits more than `request_timeout_s` ends it, so a silent client holds a worker for that
long at most.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

__all__ = ["CLOSER_CAPACITY", "PooledWSGIServer", "WorkerPool"]

CLOSER_CAPACITY = 256
"""Refused connections that may wait to be closed at once (a well-behaved client is done within a millisecond
of its 503; this bounds the sockets that slow ones hold open)."""


@dataclass(frozen=True)
class WorkerPool:
    """How many requests a pooled server answers at once and how many may wait for a worker."""

    workers: int = 32
    """Threads answering requests: the most requests in progress at once."""
    max_pending: int = 128
    """Accepted connections waiting for a worker; one more is refused with 503."""
    request_timeout_s: float = 30.0
    """Seconds one read or write on a connection may wait for the client before the connection is dropped."""
    retry_after_s: int = 1
    """The `Retry-After` of a 503 (seconds), as the policy server sends it."""
    linger_s: float = 1.0
    """Seconds a refused connection is drained of what its client still sends before it is closed."""

    def __post_init__(self) -> None:
        for name in ("workers", "max_pending", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WorkerPool.{name} must be an integer >= 1, got {value!r}")
        for name in ("request_timeout_s", "linger_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise ValueError(f"WorkerPool.{name} must be a finite number of seconds > 0, got {value!r}")

    def busy_response(self) -> bytes:
        """The whole HTTP answer to a connection that finds the queue full."""
        body = json.dumps({"error": f"the server is busy: {self.workers} requests are being answered and "
                                    f"{self.max_pending} wait; retry after {self.retry_after_s} s",
                           "limit": "max_pending", "max": self.max_pending}).encode()
        head = (f"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nRetry-After: {self.retry_after_s}\r\nConnection: close\r\n\r\n")
        return head.encode("ascii") + body


class _Closer:
    """Closes refused connections, on one thread, once their client has stopped sending (or after `linger_s`).
    Closing a socket with unread bytes resets the connection, and a client still sending its request would
    see the reset instead of the 503 already sent to it. At most `capacity` connections wait here; beyond
    that one is closed at once (its client may then see a reset)."""

    def __init__(self, linger_s: float, capacity: int) -> None:
        self.linger_s = linger_s
        self.capacity = capacity
        self._queue: queue.SimpleQueue[tuple[socket.socket, float] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="http-refused-closer", daemon=True)
        self._thread.start()

    def hand_over(self, sock: socket.socket) -> None:
        if self._queue.qsize() >= self.capacity:
            sock.close()
        else:
            self._queue.put((sock, time.monotonic() + self.linger_s))

    def close(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            sock, deadline = item
            with contextlib.suppress(OSError):  # a reset, a timeout: the connection is done either way
                while (left := deadline - time.monotonic()) > 0:
                    sock.settimeout(left)
                    if not sock.recv(1 << 16):
                        break
            sock.close()


class PooledWSGIServer(BaseWSGIServer):
    """Werkzeug's server with a fixed pool of worker threads (see the module docstring). `request_handler`
    (default Werkzeug's, as for `make_server`) is subclassed to answer one request per connection with `pool.request_timeout_s` on each
    read and write; `busy_response` replaces the 503 answer (the whole HTTP message) for a server whose
    errors have another shape."""

    multithread = True  # wsgi.multithread: the app is called from several threads

    def __init__(self, host: str, port: int, app: Any, pool: WorkerPool, *,
                 request_handler: type[WSGIRequestHandler] | None = None, busy_response: bytes | None = None,
                 **server_kwargs: Any) -> None:
        base = request_handler or WSGIRequestHandler
        one_request = type(f"OneRequest{base.__name__}", (base,),
                           {"protocol_version": "HTTP/1.0", "timeout": pool.request_timeout_s})
        super().__init__(host, port, app, one_request, **server_kwargs)
        self.pool = pool
        self._busy = busy_response if busy_response is not None else pool.busy_response()
        self._pending: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._closer = _Closer(pool.linger_s, CLOSER_CAPACITY)
        self._closed = False
        self.refused = 0  # connections refused with 503 so far
        self._workers = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                         for i in range(pool.workers)]
        for thread in self._workers:
            thread.start()

    def pending(self) -> int:
        """Accepted connections waiting for a worker now."""
        return self._pending.qsize()

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: queue the connection for a worker, or refuse it when `max_pending` wait.
        Only this thread adds to the queue, so the size it reads cannot grow before it adds."""
        if self._pending.qsize() >= self.pool.max_pending:
            self._refuse(request)
        else:
            self._pending.put((request, client_address))

    def _refuse(self, sock: socket.socket) -> None:
        self.refused += 1  # only the accepting thread writes it
        try:
            sock.setblocking(False)  # the accepting thread never waits for a client
            sock.send(self._busy)  # a few hundred bytes: they fit in a fresh connection's send buffer
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone already
            sock.close()
            return
        self._closer.hand_over(sock)

    def _work(self) -> None:
        while (item := self._pending.get()) is not None:
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # as socketserver's threads do: report it, keep serving
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        """Close the listening socket and the connections still waiting; the workers stop once their request
        in progress is answered. Safe to call twice (`serve_forever` calls it too)."""
        super().server_close()
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Empty):
            while (item := self._pending.get_nowait()) is not None:
                self.shutdown_request(item[0])
        for _ in self._workers:
            self._pending.put(None)
        self._closer.close()
