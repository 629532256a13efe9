"""Search-QA retrieval server: the work of one request is bounded (queries, topk, queries x topk, characters,
body), each refusal a JSON error naming its limit; answers stay byte for byte what they were; and a small
request is answered between the chunks of a large one (ordering forced with gates, never by timing)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask import Flask, jsonify
from search_qa_helpers import held_first_call_encoder, tiny_index

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.retriever import (
    MAX_QUERIES_PER_REQUEST,
    MAX_RESULTS_PER_REQUEST,
    DenseRetriever,
    EncodeBatcher,
    HttpRetriever,
)
from agentgym_opsd.environments.search_qa.scheduler import FairScheduler, Ticket
from agentgym_opsd.environments.search_qa.serve import RetrieveLimits, create_app, main

SMALL = RetrieveLimits(max_queries=8, max_topk=5, max_results=20, max_query_chars=200, max_body_bytes=4096,
                       chunk_queries=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    return tiny_index(tmp_path_factory.mktemp("limits"))


def _client(folder: Path, limits: RetrieveLimits | None = None) -> Any:
    return create_app(DenseRetriever(folder, encoder=HashingEncoder().encode), limits).test_client()


def _post(client: Any, payload: Any) -> tuple[int, Any]:
    reply = client.post("/retrieve", data=json.dumps(payload), content_type="application/json")
    return reply.status_code, reply.get_json()


# ------------------------------------------------------------------------------------------------ limits


@pytest.mark.parametrize(("payload", "status", "limit"), [
    ({"queries": ["a"] * 9, "topk": 1}, 400, "max_queries"),
    ({"queries": ["a"], "topk": 6}, 400, "max_topk"),
    ({"queries": ["a"] * 5, "topk": 5}, 413, "max_results"),       # 25 passages > 20
    ({"queries": ["a"] * 7}, 413, "max_results"),                  # topk missing = 3: 21 > 20
    ({"queries": ["x" * 101, "y" * 100], "topk": 1}, 413, "max_query_chars"),
])
def test_over_a_limit_is_a_json_error_naming_it(tiny: tuple[Any, Path], payload: dict, status: int,
                                                 limit: str) -> None:
    code, reply = _post(_client(tiny[1], SMALL), payload)
    maximum = getattr(SMALL, limit)
    assert (code, reply["limit"], reply["max"]) == (status, limit, maximum)
    assert limit in reply["error"] and str(maximum) in reply["error"]


def test_an_oversize_body_names_its_limit(tiny: tuple[Any, Path]) -> None:
    reply = _client(tiny[1], SMALL).post("/retrieve", data=b'{"queries": ["' + b"a" * 5000 + b'"]}',
                                         content_type="application/json")
    assert reply.status_code == 413 and reply.get_json()["limit"] == "max_body_bytes"


@pytest.mark.parametrize("payload", [
    {"queries": ["a"] * 8, "topk": 2},                   # max_queries
    {"queries": ["a"] * 4, "topk": 5},                   # max_topk, and max_results exactly (20)
    {"queries": ["x" * 100, "y" * 100], "topk": 1},      # max_query_chars exactly
])
def test_at_the_limits_is_answered(tiny: tuple[Any, Path], payload: dict) -> None:
    code, reply = _post(_client(tiny[1], SMALL), payload)
    assert code == 200 and [len(hits) for hits in reply["result"]] == [payload["topk"]] * len(payload["queries"])


def test_default_limits_refuse_the_reported_attack_and_answer_the_largest_allowed(tiny: tuple[Any, Path]) -> None:
    client = _client(tiny[1])
    queries = [f"capital city {i}" for i in range(MAX_QUERIES_PER_REQUEST)]
    code, reply = _post(client, {"queries": queries, "topk": 100, "return_scores": True})  # 22.9 MB once
    assert (code, reply["limit"], reply["max"]) == (413, "max_results", MAX_RESULTS_PER_REQUEST)
    code, reply = _post(client, {"queries": queries, "topk": MAX_RESULTS_PER_REQUEST // len(queries)})
    assert code == 200 and len(reply["result"]) == len(queries) and all(len(h) == 10 for h in reply["result"])
    code, reply = _post(client, {"queries": queries[:1], "topk": 100})  # the environment's largest request
    assert code == 200 and len(reply["result"][0]) == 100


def test_http_client_stays_under_the_passage_limit(tiny: tuple[Any, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    client, sizes = _client(tiny[1]), []

    def urlopen(request: Any, timeout: float) -> Any:  # HttpRetriever's requests, answered in process
        payload = json.loads(request.data)
        sizes.append(len(payload["queries"]) * payload["topk"])
        reply = client.post("/retrieve", data=request.data, content_type="application/json")
        assert reply.status_code == 200, reply.get_json()

        class Response:
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: Any) -> None:
                return None

            def read(self) -> bytes:
                return reply.get_data()

        return Response()

    monkeypatch.setattr("urllib.request.urlopen", urlopen)
    hits = HttpRetriever("http://127.0.0.1:1").retrieve([f"q {i}" for i in range(250)], 100)
    assert len(hits) == 250 and all(len(h) == 100 for h in hits)
    assert len(sizes) == 3 and max(sizes) <= MAX_RESULTS_PER_REQUEST


def test_limit_flags_are_checked(tiny: tuple[Any, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--max-topk", "101"], ["--max-results", "0"], ["--chunk-queries", "-1"]):
        with pytest.raises(SystemExit) as exc:
            main(["--index", str(tiny[1]), *flags])
        assert exc.value.code == 2 and flags[0] in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_topk"):
        RetrieveLimits(max_topk=101)


# --------------------------------------------------------------------------------------- same answers


@pytest.mark.parametrize("return_scores", [True, False])
def test_chunked_answers_are_byte_for_byte_jsonify_of_retrieve(tiny: tuple[Any, Path], return_scores: bool) -> None:
    data, folder = tiny
    queries = [p.contents for p in data.passages[:7]] + ["\u00e9t\u00e9 \U0001f600 \"quoted\"", ""]
    retriever = DenseRetriever(folder, encoder=HashingEncoder().encode)
    reference = Flask("reference")
    for chunk in (1, 2, 4, 64):
        client = _client(folder, RetrieveLimits(chunk_queries=chunk))
        reply = client.post("/retrieve", json={"queries": queries, "topk": 5, "return_scores": return_scores})
        hits = retriever.retrieve(queries, 5)
        out = [[{"document": {"id": h.passage.id, "contents": h.passage.contents}, "score": h.score}
                if return_scores else {"id": h.passage.id, "contents": h.passage.contents} for h in hs]
               for hs in hits]
        with reference.app_context():
            want = jsonify({"result": out}).get_data()
        assert reply.status_code == 200 and reply.mimetype == "application/json" and reply.get_data() == want


# --------------------------------------------------------------------------------------------- fairness


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def test_scheduler_gives_a_first_turn_before_later_ones() -> None:
    scheduler = FairScheduler()
    large, other, small = scheduler.ticket(), scheduler.ticket(), scheduler.ticket()
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def work(name: str, ticket: Ticket, turns: int) -> None:
        for _ in range(turns):
            with scheduler.turn(ticket):
                order.append(name)
                if name == "large" and len(order) == 1:
                    holding.set()
                    release.wait(30)

    threads = [threading.Thread(target=work, args=("large", large, 3))]
    threads[0].start()
    assert holding.wait(30)
    threads.append(threading.Thread(target=work, args=("other", other, 1)))  # arrived second, first turn
    threads[-1].start()
    _wait_until(lambda: scheduler.waiting() == 1, "the other request waits")
    threads.append(threading.Thread(target=work, args=("small", small, 1)))
    threads[-1].start()
    _wait_until(lambda: scheduler.waiting() == 2, "the small request waits")
    release.set()
    for t in threads:
        t.join(30)
    # first turns by arrival, then the large request's later turns
    assert order == ["large", "other", "small", "large", "large"]


def test_later_turns_go_whole_request_after_request() -> None:
    scheduler = FairScheduler()
    first, second, holder = scheduler.ticket(), scheduler.ticket(), scheduler.ticket()
    first.turns = second.turns = 1  # both large requests have had their first turn
    order: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with scheduler.turn(holder):
            holding.set()
            release.wait(30)

    def work(name: str, ticket: Ticket) -> None:
        for _ in range(2):
            with scheduler.turn(ticket):
                order.append(name)

    threads = [threading.Thread(target=hold)]
    threads[0].start()
    assert holding.wait(30)
    for count, (name, ticket) in enumerate([("second", second), ("first", first)], start=1):  # second queues first
        threads.append(threading.Thread(target=work, args=(name, ticket)))
        threads[-1].start()
        _wait_until(lambda count=count: scheduler.waiting() == count, f"{name} waits")
    release.set()
    for t in threads:
        t.join(30)
    assert order == ["first", "first", "second", "second"]  # by arrival of the request, not of the turn


def test_encoder_takes_lower_priority_first_and_parts_one_call_each() -> None:
    calls: list[list[str]] = []
    release = threading.Event()
    batcher = EncodeBatcher(held_first_call_encoder(calls, release), max_texts=2)
    results: dict[str, Any] = {}
    large = threading.Thread(target=lambda: results.update(large=batcher.encode_parts(
        [["1", "2"], ["3", "4"], ["5", "6"]], [0, 7, 7])))
    large.start()
    _wait_until(lambda: len(calls) == 1, "the first part is being encoded")
    small = threading.Thread(target=lambda: results.update(small=batcher(["9"], priority=0)))
    small.start()
    _wait_until(lambda: len(batcher._queue) == 3, "the small caller is queued")
    release.set()
    large.join(30)
    small.join(30)
    assert calls == [["1", "2"], ["9"], ["3", "4"], ["5", "6"]]
    assert [r.ravel().tolist() for r in results["large"]] == [[1, 2], [3, 4], [5, 6]]
    assert results["small"].ravel().tolist() == [9.0]


class _GatedEncoder:
    """The hashing encoder, recording each call; it holds the large request's first call until the small
    request is queued behind it, and its third call until the small request has been answered."""

    def __init__(self, small_queued: threading.Event, small_answered: threading.Event) -> None:
        self.calls: list[list[str]] = []
        self.small_queued, self.small_answered = small_queued, small_answered
        self.gate_timed_out = False
        self._inner = HashingEncoder()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            self.gate_timed_out |= not self.small_queued.wait(30)
        elif len(self.calls) == 3:
            self.gate_timed_out |= not self.small_answered.wait(30)
        return self._inner.encode(texts)


@contextmanager
def _in_thread(fn: Callable[[], Any], into: dict[str, Any], key: str) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=lambda: into.__setitem__(key, fn()))
    thread.start()
    try:
        yield thread
    finally:
        thread.join(60)


def test_small_request_is_answered_between_the_chunks_of_a_large_one(tiny: tuple[Any, Path]) -> None:
    data, folder = tiny
    small_queued, small_answered = threading.Event(), threading.Event()
    encoder = _GatedEncoder(small_queued, small_answered)
    retriever = DenseRetriever(folder, encoder=encoder)
    app = create_app(retriever, RetrieveLimits(chunk_queries=64))
    large_queries = [f"{p.title} capital {i}" for i, p in enumerate(data.passages[:100] * 2)]  # 200: 4 chunks
    replies: dict[str, Any] = {}
    finished: list[str] = []

    def ask(name: str, queries: list[str]) -> Callable[[], Any]:
        def run() -> Any:
            reply = app.test_client().post("/retrieve", json={"queries": queries, "topk": 3})
            finished.append(name)
            if name == "small":
                small_answered.set()
            return reply.status_code, reply.get_json()
        return run

    with _in_thread(ask("large", large_queries), replies, "large"):
        _wait_until(lambda: len(encoder.calls) == 1, "the large request's first chunk is encoding")
        with _in_thread(ask("small", ["the small one"]), replies, "small"):
            _wait_until(lambda: any(job.texts == ["the small one"] for *_, job in retriever._batcher._queue),
                        "the small request is queued")
            small_queued.set()
    assert not encoder.gate_timed_out and finished == ["small", "large"]
    assert [len(c) for c in encoder.calls] == [64, 1, 64, 64, 8] and encoder.calls[1] == ["the small one"]
    reference = DenseRetriever(folder, encoder=HashingEncoder().encode)
    for name, queries in (("small", ["the small one"]), ("large", large_queries)):
        status, reply = replies[name]
        want = [[h.passage.id for h in hits] for hits in reference.retrieve(queries, 3)]
        assert status == 200 and [[d["id"] for d in hits] for hits in reply["result"]] == want


class _GatedScheduler(FairScheduler):
    """Holds the first request's first turn until another request waits for a turn, and its second turn
    until `release` is set; records who had each turn."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.order: list[tuple[int, int]] = []
        self.gate_timed_out = False

    @contextmanager
    def turn(self, ticket: Ticket) -> Iterator[None]:
        with super().turn(ticket):
            self.order.append((ticket.arrival, ticket.turns))
            if ticket.arrival == 0 and ticket.turns == 0:
                deadline = time.monotonic() + 30
                while not self.waiting() and time.monotonic() < deadline:
                    time.sleep(0.005)
                self.gate_timed_out |= not self.waiting()
            elif ticket.arrival == 0 and ticket.turns == 1:
                self.gate_timed_out |= not self.release.wait(30)
            yield


def test_small_request_is_written_out_between_the_turns_of_a_large_one(tiny: tuple[Any, Path]) -> None:
    _, folder = tiny
    small_answered = threading.Event()
    scheduler = _GatedScheduler(small_answered)
    app = create_app(DenseRetriever(folder, encoder=HashingEncoder().encode), RetrieveLimits(chunk_queries=4),
                     scheduler=scheduler)
    replies: dict[str, Any] = {}

    def ask(queries: list[str], done: threading.Event | None = None) -> Callable[[], Any]:
        def run() -> Any:
            reply = app.test_client().post("/retrieve", json={"queries": queries, "topk": 2})
            if done is not None:
                done.set()
            return reply.status_code, len(reply.get_json()["result"])
        return run

    with _in_thread(ask([f"city {i}" for i in range(12)]), replies, "large"):
        _wait_until(lambda: bool(scheduler.order), "the large request has its first turn")
        with _in_thread(ask(["the small one"], small_answered), replies, "small"):
            pass
    assert not scheduler.gate_timed_out
    assert scheduler.order == [(0, 0), (1, 0), (0, 1), (0, 2)]  # the small request's turn came second
    assert replies == {"large": (200, 12), "small": (200, 1)}
