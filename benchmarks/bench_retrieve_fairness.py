"""Retrieval server fairness: how long a 1-query request waits while large (allowed) requests are in flight,
with the work of a request done whole (before-style) and in chunks (now), side by side in one run.

"whole" is this server with `chunk_queries` = 1,024: each request one encoder job, queued first come first
served, and one scheduler turn, as the server before chunking encoded it. (That server wrote its answers out
with no turns, interleaved by the GIL, so with a single large request in flight it did better than "whole":
measured once, 50 ms; with 4 in flight it did as badly, 1.5 s.)

The corpus is the tiny generated world (133 passages, as the tests use) with the hashing encoder, slowed to
`--encode-ms` per text to stand in for MiniLM (it sleeps, as a call to an encoder on an accelerator waits:
what is measured is the server's own queueing, not how BLAS threads share the host's cores). Each server
runs in a process of its own, as `serve.py` does, over a real socket. A large request is the most the
default limits allow at its topk: 1,024 queries x topk 10 = 10,240 passages. N client threads send large
requests back to back while single queries (topk 3) are timed one after another; "alone" is with nothing
else in flight. Then N large requests are sent at once, with nothing else, and timed until all are answered
(throughput; the median of `--repeats`). The last line is what the limits now do with the reported attack,
1,024 queries x topk 100.

    python benchmarks/bench_retrieve_fairness.py                 # about a minute
    python benchmarks/bench_retrieve_fairness.py --inflight 1 2 4 8 --samples 12
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.generator import generate_dataset
from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder
from agentgym_opsd.environments.search_qa.retriever import MAX_QUERIES_PER_REQUEST, DenseRetriever
from agentgym_opsd.environments.search_qa.serve import RetrieveLimits, create_app

LARGE_TOPK = 10


class SlowEncoder:
    """The hashing encoder, taking `ms_per_text` per text like a model would (sleeping)."""

    def __init__(self, ms_per_text: float) -> None:
        self.seconds_per_text = ms_per_text / 1000
        self._inner = HashingEncoder()

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(self.seconds_per_text * len(texts))
        return self._inner.encode(texts)


def _serve(folder: str, chunk_queries: int, encode_ms: float, port: Any) -> None:
    """The server process: the index of `folder` with a SlowEncoder, answering until terminated."""
    from agentgym_opsd.serving import HTTPLimits, wsgi_host
    from agentgym_opsd.serving.host import bind, build_server

    retriever = DenseRetriever(folder, encoder=SlowEncoder(encode_ms))
    sock = bind("127.0.0.1", 0)
    port.put(sock.getsockname()[1])
    build_server(wsgi_host(create_app(retriever, RetrieveLimits(chunk_queries=chunk_queries)), HTTPLimits())).run(
        sockets=[sock])


@contextlib.contextmanager
def server(folder: Path, chunk_queries: int, encode_ms: float) -> Iterator[str]:
    """A server process (see `_serve`); yields the URL of its /retrieve."""
    context = multiprocessing.get_context("spawn")
    port = context.Queue()
    process = context.Process(target=_serve, args=(str(folder), chunk_queries, encode_ms, port), daemon=True)
    process.start()
    try:
        yield f"http://127.0.0.1:{port.get(timeout=120)}/retrieve"
    finally:
        process.terminate()
        process.join(timeout=30)


def post(url: str, queries: list[str], topk: int) -> tuple[int, bytes, float]:
    """(status, reply, seconds)."""
    body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    return status, raw, time.perf_counter() - started


def all_together(url: str, count: int, large: list[str]) -> float:
    """Seconds until `count` large requests sent at once are all answered."""
    started = time.perf_counter()
    threads = [threading.Thread(target=post, args=(url, large, LARGE_TOPK)) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return time.perf_counter() - started


def small_latencies(url: str, inflight: int, samples: int, large: list[str]) -> list[float]:
    """Seconds of `samples` single queries while `inflight` threads keep large requests in flight."""
    stop = threading.Event()
    started = threading.Barrier(inflight + 1)

    def keep_sending() -> None:
        started.wait()
        while not stop.is_set():
            assert post(url, large, LARGE_TOPK)[0] == 200

    threads = [threading.Thread(target=keep_sending, daemon=True) for _ in range(inflight)]
    for t in threads:
        t.start()
    if inflight:
        started.wait()
        time.sleep(0.2)  # the large requests are under way
    seconds = []
    for i in range(samples):
        status, _, took = post(url, [f"capital of country number {i}"], 3)
        assert status == 200, status
        seconds.append(took)
        time.sleep(0.05 + 0.05 * (i % 3))  # land at different points of the large requests' work
    stop.set()
    for t in threads:
        t.join(timeout=600)
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inflight", type=int, nargs="+", default=[1, 4], help="large requests in flight (default 1 4)")
    p.add_argument("--samples", type=int, default=8, help="timed single queries per row (default 8)")
    p.add_argument("--repeats", type=int, default=3, help="timings of N large requests at once (default 3)")
    p.add_argument("--encode-ms", type=float, default=0.5, help="encoder time per text in ms (default 0.5)")
    p.add_argument("--chunk", type=int, default=RetrieveLimits().chunk_queries, help="queries per chunk (now)")
    args = p.parse_args(argv)

    data = generate_dataset("tiny")
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_index_folder(Path(tmp) / "idx", data.passages, HashingEncoder().encode,
                                    IndexConfig(kind="flat"), progress=False)
        large = [f"{p.title} and the capital city {i}" for i, p in
                 zip(range(MAX_QUERIES_PER_REQUEST), data.passages * 10, strict=False)]
        modes = {"whole (before)": MAX_QUERIES_PER_REQUEST, f"chunks of {args.chunk} (now)": args.chunk}
        table = Table(title=f"1-query latency while N large requests ({len(large)} queries x topk {LARGE_TOPK}) "
                            f"are in flight; encoder {args.encode_ms} ms/text")
        for column in ("request work", "N large in flight", "1-query p50 ms", "1-query max ms", "N large at once s"):
            table.add_column(column, justify="left" if column == "request work" else "right")
        chunk_ms = 0.0
        for name, chunk in modes.items():
            with server(folder, chunk, args.encode_ms) as url:
                post(url, ["warm up"], 3)
                if chunk < len(large):  # one chunk of a large request, as a request of its own
                    chunk_ms = 1000 * statistics.median(post(url, large[:chunk], LARGE_TOPK)[2] for _ in range(3))
                for inflight in [0, *args.inflight]:
                    small = small_latencies(url, inflight, args.samples, large)
                    together = (statistics.median(all_together(url, inflight, large) for _ in range(args.repeats))
                                if inflight else None)
                    table.add_row(name, str(inflight) if inflight else "0 (alone)",
                                  f"{1000 * statistics.median(small):.1f}", f"{1000 * max(small):.1f}",
                                  "-" if together is None else f"{together:.2f}")
        console.print(table)
        console.print(f"One chunk of a large request ({args.chunk} queries x topk {LARGE_TOPK}) sent as a request "
                      f"of its own: {chunk_ms:.1f} ms. Now a single query waits for at most the encoder call in "
                      f"progress (one chunk) and the turn in progress (one chunk's passages and JSON), however "
                      f"many large requests are in flight.")
        with server(folder, args.chunk, 0.0) as url:
            status, raw, seconds = post(url, large, 100)
        console.print(f"The reported attack, {len(large)} queries x topk 100: HTTP {status} in "
                      f"{1000 * seconds:.1f} ms, {len(raw)} bytes: {json.loads(raw).get('error')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
