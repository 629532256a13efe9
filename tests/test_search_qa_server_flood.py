"""The retrieval server under a flood of connections (issue 22): a fixed pool of workers, a bounded number of
requests waiting, a JSON 503 with Retry-After beyond it, the same number of threads however many connect, and
answers again once the flood is over; `HttpRetriever` waits out a 503 as told. The server runs on the serving
kit's host (`agentgym_opsd.serving.host`, uvicorn)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from search_qa_helpers import STACKS_ON_SIGUSR1, ignore_sigint, server_with_encoder, wait_or_show_stacks
from search_qa_helpers import tiny_index as build_tiny_index

from agentgym_opsd.environments.search_qa.data import Passage
from agentgym_opsd.environments.search_qa.retriever import HttpRetriever, SearchHit
from agentgym_opsd.environments.search_qa.serve import create_app
from agentgym_opsd.serving import BackgroundServer, GuardedHTTP, HTTPLimits, wsgi_host

PASSAGE = Passage.from_contents("p1", "Title\nsome text")


class HeldRetriever:
    """Answers every query with PASSAGE once `release` is set; counts the calls that started."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self._lock = threading.Lock()

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        with self._lock:
            self.started += 1
        assert self.release.wait(60), "the test never released the retriever"
        return [[SearchHit(PASSAGE, 1.0)] for _ in queries]


@contextlib.contextmanager
def pooled(app: Any, limits: HTTPLimits) -> Iterator[tuple[GuardedHTTP, int]]:
    """`app` on the host on a free loopback port; yields (the guarded app, with its counters, port)."""
    with BackgroundServer(wsgi_host(app, limits)) as server:
        yield server.app, server.port


def wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def started_since(before: set[threading.Thread]) -> set[threading.Thread]:
    """The threads alive now that were not in `before`; a set, not a count, so that a thread of an earlier
    test ending in the meantime cannot make the pool look smaller than it is."""
    return set(threading.enumerate()) - before


def request_bytes(queries: list[str]) -> bytes:
    body = json.dumps({"queries": queries, "topk": 1}).encode()
    return (b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def read_answer(sock: socket.socket, timeout_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP answer to its end (the server closes every connection after one request)."""
    sock.settimeout(timeout_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_a_flood_gets_503_beyond_the_queue_with_no_more_threads_and_the_server_answers_after(recwarn) -> None:
    """2 workers, 3 waiting, 40 connections at once from one thread: the 2 in progress and the 3 waiting are
    answered once the retriever is released, every other one gets a JSON 503 with Retry-After at once, and the
    process runs no thread beyond the workers' (a thread per connection would have been 40)."""
    limits = HTTPLimits(workers=2, max_pending=3)
    retriever = HeldRetriever()
    threads_before = set(threading.enumerate())
    with pooled(create_app(retriever), limits) as (guard, port):
        flood = []
        for i in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(request_bytes([f"q{i}"]))
            flood.append(sock)
        wait_for(lambda: retriever.started == limits.workers and guard.refused == len(flood) - limits.max_in_progress,
                 "the server never took in the whole flood")
        assert guard.guarded_in_progress == limits.max_in_progress
        busy, held = [], []
        for sock in flood:  # every refused connection has its answer already, while the workers are still held
            sock.settimeout(0.5)
            try:
                peeked = sock.recv(12, socket.MSG_PEEK)
            except TimeoutError:
                held.append(sock)
                continue
            (busy if b" 503" in peeked else held).append(sock)
        threads = started_since(threads_before)
        assert len(threads) <= limits.workers + 2, threads  # the workers, the server's thread (+ asyncio's own)
        assert len(busy) == guard.refused and len(held) == limits.max_in_progress
        for sock in busy:
            status, headers, body = read_answer(sock)
            assert status == 503 and headers["retry-after"] == "1"
            assert headers["content-type"] == "application/json"
            reply = json.loads(body)
            assert reply["limit"] == "max_pending" and reply["max"] == 3 and "busy" in reply["error"]
        retriever.release.set()
        for sock in held:  # in progress or waiting: answered in full once the retriever is free
            status, _, body = read_answer(sock)
            assert status == 200, body
            assert json.loads(body)["result"][0][0]["id"] == "p1"
        assert retriever.started == len(held)
        # the flood is over: the server answers as before, with no more threads
        status, _, body = _post(port, ["after"])
        assert status == 200 and json.loads(body)["result"][0][0]["id"] == "p1"
        assert len(started_since(threads_before)) <= limits.workers + 2
    assert not [w for w in recwarn if issubclass(w.category, ResourceWarning)]


def _post(port: int, queries: list[str]) -> tuple[int, dict[str, str], bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(request_bytes(queries))
    return read_answer(sock)


def test_http_retriever_waits_out_a_503_and_gets_the_answer() -> None:
    """1 worker held, 1 connection queued: the client's request is refused with 503, and answered when it
    comes back after Retry-After (1 s), once the retriever is free."""
    limits = HTTPLimits(workers=1, max_pending=1)
    retriever = HeldRetriever()
    with pooled(create_app(retriever), limits) as (server, port):
        blockers = []
        for query, held in (("held", lambda: retriever.started == 1), ("queued", lambda: server.guarded_in_progress == 2)):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(request_bytes([query]))
            blockers.append(sock)
            deadline = time.monotonic() + 30
            while not held():
                assert time.monotonic() < deadline, f"the {query!r} request never took its place"
                time.sleep(0.01)
        assert _post(port, ["refused"])[0] == 503
        found: dict[str, Any] = {}
        client = threading.Thread(target=lambda: found.update(
            hits=HttpRetriever(f"http://127.0.0.1:{port}", busy_retries=5).retrieve(["client"], 1)))
        assert server.refused == 1
        t0 = time.monotonic()
        client.start()
        while server.refused < 2:  # the client's first attempt is refused while both places are taken
            assert time.monotonic() - t0 < 30, "the client never came"
            time.sleep(0.01)
        retriever.release.set()
        client.join(timeout=30)
        assert found["hits"][0][0].passage.id == "p1"
        assert time.monotonic() - t0 >= 0.9 and server.refused == 2  # it waited out the Retry-After, then got in
        assert all(read_answer(sock)[0] == 200 for sock in blockers)
    with pytest.raises(ValueError, match="busy_retries"):
        HttpRetriever("http://127.0.0.1:1", busy_retries=-1)


@pytest.mark.parametrize("kwargs", [{"workers": 0}, {"max_pending": True}, {"body_timeout_s": float("inf")},
                                    {"shutdown_grace_s": 0}])
def test_http_limits_refuse_settings_that_cannot_work(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"HTTPLimits.{next(iter(kwargs))}"):
        HTTPLimits(**kwargs)


# ------------------------------------------------------------------------------ the command line, end to end

_SLOW_SERVER = server_with_encoder("""
def encode(texts):
    if any(text.startswith("slow") for text in texts):
        time.sleep(5)
    return HashingEncoder().encode(texts)
""")


def _threads(pid: int) -> int:
    return int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="counts threads through /proc")
def test_serve_main_keeps_its_threads_under_a_flood(tmp_path: Path) -> None:
    """`python -m ...search_qa.serve --workers 2 --max-pending 2`: 60 connections at once while both workers
    are busy; the process's thread count does not grow, the excess gets 503, and it answers afterwards."""
    _, folder = build_tiny_index(tmp_path)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    stderr_path = tmp_path / "server.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", STACKS_ON_SIGUSR1 + _SLOW_SERVER, "--index", str(folder),
                                 "--port", "0", "--workers", "2", "--max-pending", "2"],
                                stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, preexec_fn=ignore_sigint)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match and "2 workers" in line, f"no banner, got {line!r}"
        port = int(match.group(1))
        assert _post(port, ["warm"])[0] == 200  # whatever starts on a first request has started
        baseline = _threads(proc.pid)
        slow = []
        for i in range(2):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(request_bytes([f"slow {i}"]))
            slow.append(sock)
        flood = []  # the slow two hold both workers (or wait for them): at most 2 of these can be queued
        for i in range(60):
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            sock.sendall(request_bytes([f"flood {i}"]))
            flood.append(sock)
        most = _threads(proc.pid)
        answers = [read_answer(sock)[0] for sock in flood]
        most = max(most, _threads(proc.pid))
        # the host starts its 2 worker threads as they are first needed: the warm-up started one
        assert most <= baseline + 1, f"{most} threads under the flood, {baseline} before"
        assert answers.count(503) >= 60 - 2 and set(answers) <= {200, 503}
        assert [read_answer(sock)[0] for sock in slow] == [200, 200]
        assert _post(port, ["after"])[0] == 200
        proc.send_signal(signal.SIGTERM)  # a graceful stop, like SIGINT
        assert wait_or_show_stacks(proc, stderr_path, timeout=180) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ------------------------------------------------------------------ slow clients (issue 35, item 3)

@pytest.fixture(scope="module")
def tiny_app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real app over the tiny world's index (hashing encoder)."""
    from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
    from agentgym_opsd.environments.search_qa.retriever import DenseRetriever

    _, folder = build_tiny_index(tmp_path_factory.mktemp("slow"))
    return create_app(DenseRetriever(folder, encoder=HashingEncoder().encode))


def test_idle_and_trickling_clients_hold_no_worker_and_time_out_with_408(tiny_app: Any) -> None:
    """4 workers; 40 connections that send nothing and 40 that trickle their head a byte every 0.2 s (the
    report: 33 such made a one-query request wait 29 s on 32 workers). A real query is answered at once
    (< 2 s), and each slow connection gets a JSON 408 once its 1.5 s for the head are over."""
    limits = HTTPLimits(workers=4, header_timeout_s=1.5)
    head = b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with pooled(tiny_app, limits) as (guard, port):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(40)]
        trickling = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(40)]
        stop = threading.Event()

        def trickle() -> None:
            for i in range(len(head)):
                if stop.wait(0.2):
                    return
                for sock in trickling:
                    with contextlib.suppress(OSError):
                        sock.send(head[i:i + 1])

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            time.sleep(0.5)  # all 80 accepted and sending
            started = time.monotonic()
            status, _, body = _post(port, ["who founded"])
            assert status == 200 and json.loads(body)["result"], body
            assert time.monotonic() - started < 2.0
        finally:
            stop.set()
            sender.join(timeout=10)
        for sock in (idle[0], trickling[0]):
            status, headers, body = read_answer(sock)
            assert status == 408 and headers["content-type"] == "application/json"
            assert json.loads(body)["limit"] == "header_timeout_s"
        for sock in idle[1:] + trickling[1:]:
            sock.close()
        assert guard.refused == 0


def test_a_slow_body_is_cut_at_its_deadline_and_a_large_one_is_read_through(tiny_app: Any) -> None:
    """A head sent whole and a body trickled: 408 `body_timeout_s` after 1 s, with the only worker free all
    along. A body of many packets, sent in one go, and a chunked one are answered as usual."""
    limits = HTTPLimits(workers=1, body_timeout_s=1.0)
    with pooled(tiny_app, limits) as (_, port):
        slow = socket.create_connection(("127.0.0.1", port), timeout=30)
        slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{")
        assert _post(port, ["a query meanwhile"])[0] == 200
        status, _, body = read_answer(slow)
        assert status == 408 and json.loads(body)["limit"] == "body_timeout_s"
        queries = [f"query {i} " + "word " * 400 for i in range(40)]  # ~80 KB: many packets
        status, _, body = _post(port, queries)
        assert status == 200 and len(json.loads(body)["result"]) == 40
        chunked = socket.create_connection(("127.0.0.1", port), timeout=30)
        payload = json.dumps({"queries": ["chunked"], "topk": 1}).encode()
        chunked.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
                            b"%x\r\n%s\r\n" % (len(part), part) for part in (payload[:7], payload[7:])) + b"0\r\n\r\n")
        status, _, body = read_answer(chunked)
        assert status == 200 and len(json.loads(body)["result"]) == 1


def test_connections_beyond_max_connections_are_refused_at_once(tiny_app: Any) -> None:
    limits = HTTPLimits(workers=1, max_connections=5)
    with pooled(tiny_app, limits) as (_, port):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(5)]
        time.sleep(0.3)  # accepted
        status, headers, body = _post(port, ["one too many"])
        assert status == 503 and headers["retry-after"] == "1"
        assert json.loads(body)["limit"] == "max_connections" and json.loads(body)["max"] == 5
        for sock in idle:
            sock.close()
        time.sleep(0.3)  # their ends seen
        assert _post(port, ["after"])[0] == 200
