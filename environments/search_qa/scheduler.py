"""Fair turns for the retrieval server's request threads: a large request works in chunks, one turn each,
and the first chunk of any request goes before the later chunks of all others.

One turn at a time (the work is CPU-bound Python and holds the GIL anyway). When a turn ends, the next goes
to a request waiting for its first turn, if any (the earliest to arrive); otherwise to the earliest of the
requests waiting for a later turn. So a request of one chunk, arriving while large ones are in flight, waits
for at most the turn in progress, while large requests run one after another, not interleaved (which would
make each of them as slow as all of them together). The same order, `Ticket.rank`, is the server's priority
for its chunks at the encoder (`retriever.EncodeBatcher`). Under a steady flood of new requests the later
chunks wait until it ebbs: small requests are the ones kept fast. `close` (the server is stopping) makes every
waiting and later turn raise `RetrievalCancelled`, so a large request ends at its next chunk.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agentgym_opsd.environments.search_qa.retriever import RetrievalCancelled

__all__ = ["FairScheduler", "Ticket"]


class Ticket:
    """One request's place with a `FairScheduler`: its arrival order and how many turns it has had."""

    __slots__ = ("arrival", "turns")

    def __init__(self, arrival: int) -> None:
        self.arrival = arrival
        self.turns = 0

    def rank(self, chunk: int) -> int:
        """Where this request's chunk `chunk` (0 = first) stands, lowest first: every first chunk is 0, a
        later one 1 + the arrival, so later chunks go in order of arrival, whole request after request."""
        return 0 if chunk == 0 else 1 + self.arrival


class FairScheduler:
    """Grants `turn(ticket)` to one thread at a time, lowest `ticket.rank(ticket.turns)` first (ties: arrival)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._waiting: list[tuple[int, int]] = []  # heap of (rank, arrival); a ticket waits once at a time
        self._arrivals = itertools.count()
        self._closed = False

    def ticket(self) -> Ticket:
        """A new request's ticket (take it when the request arrives, before its first turn)."""
        return Ticket(next(self._arrivals))

    def waiting(self) -> int:
        """How many turns are asked for and not yet granted."""
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        """Grant no more turns: those waiting and those asked for later raise RetrievalCancelled (the turn in
        progress runs to its end)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @contextmanager
    def turn(self, ticket: Ticket) -> Iterator[None]:
        """Wait for this ticket's turn, hold it for the `with` body, then hand it on; RetrievalCancelled once
        the scheduler is closed."""
        key = (ticket.rank(ticket.turns), ticket.arrival)
        with self._cond:
            heapq.heappush(self._waiting, key)
            try:
                while self._closed or self._busy or self._waiting[0] != key:
                    if self._closed:
                        raise RetrievalCancelled("the server is stopping")
                    self._cond.wait()
            except BaseException:  # interrupted while waiting: leave the queue, or the next in line waits forever
                self._waiting.remove(key)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            heapq.heappop(self._waiting)
            self._busy = True
        try:
            yield
        finally:
            ticket.turns += 1
            with self._cond:
                self._busy = False
                self._cond.notify_all()
