"""A WSGI server with a fixed pool of worker threads, for a server that must outlast a flood of connections,
idle or slow clients, and a stop signal while it works.

Werkzeug's threaded server starts a thread per connection, so a flood of connections (or of clients that
never finish sending) starts threads without bound. `PooledWSGIServer` accepts connections on one thread,
reads each request whole on another (`connections.ConnectionReader`: total deadlines on the head and the
body, a cap of `max_reading` connections being read) and hands it to one of `workers` threads through a
queue of at most `max_pending` requests. A connection beyond either cap is refused at once, the way the
policy server refuses a request when its queue is full: a 503 with `Retry-After` and a JSON body
(`{"error", "limit": "max_pending" | "max_reading", "max"}`). So clients that are slow to send cost a socket
each, never a worker, and the server never runs more than the accepting thread, the connection thread and
the workers.

Each connection carries one request (HTTP/1.0, `Connection: close`): with keep-alive an idle client would
hold a worker between its requests. A worker's read or write that waits more than `request_timeout_s` ends
the connection.

Every answer the server writes itself is JSON: the connection thread's 408/413/431/503 and the worker's refusal
of a request it cannot parse (`http.server`'s 400, 414, 431 for too many headers, ...), which would otherwise be
an HTML page.

Stopping (`stop`): the requests waiting for a worker and the connections still being read get a JSON 503 with
Retry-After; the listening socket stays open through the grace, and anyone who connects then gets that 503 at
once (a refused connection reads as a crashed server, a 503 as one to retry); the requests in progress get
`shutdown_grace_s` to end, then the app is asked to cancel them (`cancel_in_flight`, say ending them at
their next chunk of work), and the workers are waited for, then the 503s go on until no client has connected
for `DRAIN_QUIET_S` (within the grace). At the end the backlog is answered 503 too, and
the socket is closed before those answers drain, so a client that comes later is refused, never reset. A
process that exits while a worker is still inside native code (a torch encoder call, say) can abort
("terminate called without an active exception"), so the stop waits for the workers instead of leaving them
to the interpreter's exit.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import queue
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler

from agentgym_opsd.serving.connections import LINGER_CAPACITY, ConnectionReader, ReadAhead, json_response

__all__ = ["CLOSER_CAPACITY", "PooledWSGIServer", "WorkerPool"]

log = logging.getLogger(__name__)

_ACCEPT_POLL_S = 0.05  # how often the stopping server's acceptor checks whether the grace is over
DRAIN_QUIET_S = 0.3
"""A stopping server closes its listening socket once no connection has come for this long (within the grace):
longer than a client's next request takes to arrive after its answer, shorter than the Retry-After (>= 1 s) its
503s ask for. Closed sooner, a client reconnecting right after its last answer sat in the backlog the close
resets, a request lost rather than refused."""

CLOSER_CAPACITY = LINGER_CAPACITY
"""Refused connections that may wait to be closed at once (kept under its old name)."""


@dataclass(frozen=True)
class WorkerPool:
    """How many requests a pooled server answers at once, how many may wait, and how long a client may take."""

    workers: int = 32
    """Threads answering requests: the most requests in progress at once."""
    max_pending: int = 128
    """Requests read whole and waiting for a worker; one more is refused with 503."""
    max_reading: int = 512
    """Connections whose request is still arriving (read by one thread, no worker); one more is refused with
    503. Each costs a file descriptor and at most `read_ahead_bytes` of memory."""
    header_timeout_s: float = 10.0
    """Seconds from the accept to the end of the request head (the request line and headers); then 408."""
    body_timeout_s: float = 30.0
    """Seconds from the end of the head to the end of the body; then 408 (or, past `read_ahead_bytes`, the
    connection is dropped)."""
    max_body_bytes: int = 2 * 1024 * 1024
    """The largest request body: a larger Content-Length or chunk size gets 413 as soon as it is read. The app
    checks its own (equal or smaller) limit on what it reads."""
    read_ahead_bytes: int = 256 * 1024
    """Bytes of a request read before a worker takes it; a longer body is read on by the worker, within
    `body_timeout_s`."""
    request_timeout_s: float = 30.0
    """Seconds one read or write of a worker may wait for the client before the connection is dropped."""
    retry_after_s: int = 1
    """The `Retry-After` of a 503 (seconds), as the policy server sends it."""
    linger_s: float = 1.0
    """Seconds a refused connection is drained of what its client still sends before it is closed."""
    shutdown_grace_s: float = 5.0
    """Seconds the requests in progress at a stop may take to end before they are cancelled."""

    def __post_init__(self) -> None:
        for name in ("workers", "max_pending", "max_reading", "max_body_bytes", "read_ahead_bytes", "retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"WorkerPool.{name} must be an integer >= 1, got {value!r}")
        for name in ("header_timeout_s", "body_timeout_s", "request_timeout_s", "linger_s", "shutdown_grace_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ValueError(f"WorkerPool.{name} must be a finite number of seconds > 0, got {value!r}")

    def busy_response(self) -> bytes:
        """The whole HTTP answer to a request that finds the queue full."""
        return json_response(503, "Service Unavailable",
                             {"error": f"the server is busy: {self.workers} requests are being answered and "
                                       f"{self.max_pending} wait; retry after {self.retry_after_s} s",
                              "limit": "max_pending", "max": self.max_pending}, self.retry_after_s)


class _ReadAheadHandler(WSGIRequestHandler):
    """Reads the request from what the connection thread read ahead (`ReadAhead`), then from the socket."""

    server: PooledWSGIServer

    def setup(self) -> None:
        super().setup()
        read_ahead = self.server.read_ahead()
        if read_ahead is not None:
            self.rfile.close()  # the socket's own reader, unused: closing it lets the socket close in time
            self.rfile = io.BufferedReader(read_ahead)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's refusal of a request it cannot parse (400, 414, 431 too many headers, 505), as JSON
        `{"error"}` like every other answer instead of its HTML page."""
        reason = self.responses.get(code, ("Error", ""))[0]
        body = json.dumps({"error": message or reason}).encode()
        self.log_error("code %d, message %s", code, message)
        self.send_response(code, reason)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class PooledWSGIServer(BaseWSGIServer):
    """Werkzeug's server with a connection thread and a fixed pool of worker threads (see the module
    docstring). `request_handler` (default Werkzeug's, as for `make_server`) is subclassed to answer one
    request per connection, read through the connection thread, with `pool.request_timeout_s` on each read
    and write; `busy_response` replaces the 503 answer to a full queue (the whole HTTP message) for a server
    whose errors have another shape."""

    multithread = True  # wsgi.multithread: the app is called from several threads

    def __init__(self, host: str, port: int, app: Any, pool: WorkerPool, *,
                 request_handler: type[WSGIRequestHandler] | None = None, busy_response: bytes | None = None,
                 **server_kwargs: Any) -> None:
        base = request_handler or WSGIRequestHandler
        one_request = type(f"OneRequest{base.__name__}", (_ReadAheadHandler, base),
                           {"protocol_version": "HTTP/1.0", "timeout": pool.request_timeout_s})
        super().__init__(host, port, app, one_request, **server_kwargs)
        self.pool = pool
        self._pending: queue.SimpleQueue[tuple[socket.socket, Any, ReadAhead] | None] = queue.SimpleQueue()
        self._current = threading.local()  # the request a worker thread answers now
        self._connections = ConnectionReader(pool, self._offer,
                                             busy_response if busy_response is not None else pool.busy_response())
        self._closed = False
        self._stop_accepting = threading.Event()
        self._last_accept = 0.0  # time.monotonic() of the stopping acceptor's last connection
        self._workers = [threading.Thread(target=self._work, name=f"http-worker-{i}", daemon=True)
                         for i in range(pool.workers)]
        for thread in self._workers:
            thread.start()

    @property
    def refused(self) -> int:
        """Connections refused with 503 so far (a full queue or too many being read)."""
        return self._connections.refused

    @property
    def timed_out(self) -> int:
        """Connections answered 408 (head or body too slow) or 431 (head too large) so far."""
        return self._connections.timed_out

    def pending(self) -> int:
        """Requests read whole and waiting for a worker now."""
        return self._pending.qsize()

    def reading(self) -> int:
        """Connections whose request is still arriving now."""
        return self._connections.reading()

    def read_ahead(self) -> ReadAhead | None:
        """In a worker thread: what the connection thread read of the request this worker answers."""
        return getattr(self._current, "read_ahead", None)

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accepting thread: hand the connection to the connection thread, which never makes it wait."""
        self._connections.add(request, client_address)

    def _offer(self, sock: socket.socket, client_address: Any, read_ahead: ReadAhead) -> bool:
        """On the connection thread (the queue's only producer, so the size it reads cannot grow before it
        adds): queue a request read whole for a worker, unless `max_pending` wait already."""
        if self._closed or self._pending.qsize() >= self.pool.max_pending:
            return False
        self._pending.put((sock, client_address, read_ahead))
        return True

    def _work(self) -> None:
        while (item := self._pending.get()) is not None:
            request, client_address, self._current.read_ahead = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # as socketserver's threads do: report it, keep serving
                self.handle_error(request, client_address)
            finally:
                self._current.read_ahead = None
                self.shutdown_request(request)

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown` (or an exception, such as the KeyboardInterrupt of a signal). Unlike Werkzeug's
        it leaves the socket open: `stop` keeps answering it 503 through the grace, then closes it."""
        socketserver.BaseServer.serve_forever(self, poll_interval)

    def server_close(self) -> None:
        """Close the listening socket and the connections being read, answer the requests still waiting 503,
        and let the workers stop once their request in progress is answered (`stop` waits for them). Safe to
        call twice."""
        self._stop_accepting.set()
        super().server_close()
        self._begin_stop()
        self._connections.close()

    def _begin_stop(self) -> None:
        """Refuse from now on: the connection thread answers every connection 503, the requests still waiting
        for a worker get it too, and the workers end after their request in progress."""
        if self._closed:
            return
        self._closed = True
        self._connections.begin_stop()
        stopping = json_response(503, "Service Unavailable", {"error": "the server is stopping"},
                                 self.pool.retry_after_s)
        with contextlib.suppress(queue.Empty):
            while (item := self._pending.get_nowait()) is not None:
                with contextlib.suppress(OSError):  # a few hundred bytes into an empty send buffer: never waits
                    item[0].setblocking(False)
                    item[0].send(stopping)
                self.shutdown_request(item[0])
        for _ in self._workers:
            self._pending.put(None)

    def stop(self, cancel_in_flight: Callable[[], None] | None = None) -> bool:
        """Refuse new work (503 to every connection, the listening socket still answered), give the requests in
        progress `pool.shutdown_grace_s` to end, then call `cancel_in_flight` (the app's way to end its work
        early) and wait up to `pool.request_timeout_s` more; then close the server (`server_close`). True when
        every worker has ended."""
        self._begin_stop()
        grace_ends = time.monotonic() + self.pool.shutdown_grace_s
        self._last_accept = time.monotonic()
        acceptor = threading.Thread(target=self._refuse_while_stopping, name="http-stopping", daemon=True)
        acceptor.start()
        try:
            if self._join_workers(self.pool.shutdown_grace_s):
                self._wait_quiet(grace_ends)
                return True
            if cancel_in_flight is not None:
                cancel_in_flight()
            if self._join_workers(self.pool.request_timeout_s):
                return True
            busy = sum(thread.is_alive() for thread in self._workers)
            log.warning("%d requests were still in progress when the server stopped", busy)
            return False
        finally:
            self._stop_accepting.set()
            acceptor.join(timeout=2 * _ACCEPT_POLL_S + 1)
            self._answer_backlog()
            self.server_close()

    def _answer_backlog(self) -> None:
        """At the end of a stop: answer 503 to the connections in the listening socket's backlog, close that
        socket at once, then let the answered ones drain for up to `linger_s` (closing a socket the client still
        writes to resets it, and the client would see the reset instead of the 503). The close comes before the
        drain: the kernel completes connections into the backlog until the socket is closed, and the close
        resets every one nobody accepted, so a client that retried during the drain lost its request. Now one
        that connects after the last accept is refused, which a client reads as a stopped server."""
        with contextlib.suppress(OSError):  # BlockingIOError: the backlog is empty
            self.socket.setblocking(False)
            for _ in range(4 * self.request_queue_size):  # bounded: clients that retry at once would keep
                sock, address = self.socket.accept()  # this loop going for ever
                self._connections.add(sock, address)
        self.socket.close()
        deadline = time.monotonic() + self.pool.linger_s
        while self._connections.holding() and time.monotonic() < deadline:
            time.sleep(_ACCEPT_POLL_S)

    def _wait_quiet(self, until: float) -> None:
        """Keep answering 503 until no connection has come for `DRAIN_QUIET_S`, or until `until`."""
        while time.monotonic() < until and time.monotonic() - self._last_accept < DRAIN_QUIET_S:
            time.sleep(_ACCEPT_POLL_S)

    def _refuse_while_stopping(self) -> None:
        """During the grace: accept on the listening socket and hand each connection to the connection thread,
        which answers it 503 (a closed socket would refuse it). The accept does not block: a readiness that no
        longer holds (seen under load) left this thread inside accept() past the grace, until the next client
        came, and the connections that queued meanwhile were reset by the close."""
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            while not self._stop_accepting.is_set():
                if not selector.select(_ACCEPT_POLL_S):
                    continue
                with contextlib.suppress(OSError):  # BlockingIOError: nobody is waiting after all
                    sock, address = self.socket.accept()
                    self._last_accept = time.monotonic()
                    self._connections.add(sock, address)

    def _join_workers(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for thread in self._workers:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._workers)
