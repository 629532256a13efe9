"""Retrievers: queries in, top-k passages out; in-process (FAISS + MiniLM) or over HTTP.

Both speak the same `retrieve(queries, topk)`; the environment holds either. The HTTP client talks to
`serve.py` (or any server with Search-R1's `POST /retrieve`), so many training workers can share one index.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentgym_opsd.environments.search_qa.data import Passage

__all__ = ["SearchHit", "Retriever", "DenseRetriever", "HttpRetriever", "RetrievalCancelled", "RetrievalError",
           "clean_query", "EncodeBatcher", "MAX_QUERY_CHARS", "MAX_TOPK", "MAX_QUERIES_PER_REQUEST", "MAX_REQUEST_QUERY_CHARS",
           "MAX_RESULTS_PER_REQUEST", "shared_dense_retriever"]

MAX_QUERY_CHARS = 2_000
"""Queries are cut to this many characters (the encoder reads only 256 tokens anyway)."""
MAX_TOPK = 100
MAX_QUERIES_PER_REQUEST = 1_024
"""The retrieval server refuses more queries per request (HttpRetriever splits longer lists)."""
MAX_RESULTS_PER_REQUEST = 10_240
"""The retrieval server refuses requests asking for more passages (queries x topk) in total: room for a full
request of 1,024 queries at any topk up to 10 (Search-R1 clients ask for 3), while one request of 1,024 x 100
once answered 22.9 MB and held the server for seconds. HttpRetriever sends fewer queries per request when
topk is larger."""
MAX_REQUEST_QUERY_CHARS = 100_000
"""The retrieval server refuses requests whose queries hold more characters in total: encoding is the
expensive part, and one request of 1,024 x 2,000 characters once held the encoder for minutes."""
MAX_BATCH_TEXTS = 64
"""At most this many texts per merged encoder call (a single larger caller is still encoded in one call): the
MiniLM encoder's own batch, so merging more would save nothing, while smaller calls let a caller that comes
first (`EncodeBatcher` priority) go between the chunks of a large request."""


class RetrievalError(RuntimeError):
    """The retriever could not answer (server down, bad reply)."""


class RetrievalCancelled(RetrievalError):
    """The work was cancelled before it was done: its retriever or scheduler was closed (the server is stopping)."""


@dataclass(frozen=True)
class SearchHit:
    passage: Passage
    score: float


@runtime_checkable
class Retriever(Protocol):
    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        """For each query, up to `topk` hits, best first."""
        ...


def clean_query(query: str) -> str:
    """Valid UTF-8 (lone surrogates replaced), at most `MAX_QUERY_CHARS` characters, spaces collapsed."""
    text = query.encode("utf-8", errors="replace").decode("utf-8")
    return " ".join(text[:MAX_QUERY_CHARS].split())


def _check_topk(topk: int) -> None:
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise ValueError(f"topk must be an integer in [1, {MAX_TOPK}], got {topk!r}")


class _Job:
    """One caller's texts waiting in an EncodeBatcher, and their rows once encoded."""

    __slots__ = ("texts", "vectors", "error", "done")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.vectors: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False


class EncodeBatcher:
    """Merges concurrent `encode` calls into one call of the underlying encoder.

    A caller that finds the encoder busy queues its texts and waits; the caller that finds it idle encodes
    everything queued (whole callers, up to `max_texts` texts, lowest `priority` first, then first come) in
    one call and hands each caller its rows, until its own texts are done. One padded forward pass over many
    short queries costs far less than one pass per request, and concurrent requests no longer queue on a
    lock one by one. If a merged call fails,
    each caller is encoded alone, so only the caller whose texts fail gets the error. The encoder is only
    ever called by one thread at a time, so it need not be thread-safe. No thread of its own is kept.
    `close` cancels what is queued (RetrievalCancelled); the encoder call in progress runs to its end.
    """

    def __init__(self, encode: Callable[[Sequence[str]], np.ndarray], *, max_texts: int = MAX_BATCH_TEXTS) -> None:
        if max_texts < 1:
            raise ValueError(f"max_texts must be >= 1, got {max_texts}")
        self._encode = encode
        self.max_texts = max_texts
        self._queue: list[tuple[int, int, _Job]] = []  # heap of (priority, arrival, job)
        self._arrivals = itertools.count()
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()

    def __call__(self, texts: Sequence[str], priority: int = 0) -> np.ndarray:
        """The rows of `texts`. Queued callers are taken lowest `priority` first, then first come."""
        return self.encode_parts([texts], [priority])[0]

    def encode_parts(self, parts: Sequence[Sequence[str]], priorities: Sequence[int]) -> list[np.ndarray]:
        """The rows of each part, each part queued as a caller of its own at its priority. A large request
        queues all its chunks at once, so while this caller encodes they go out one call after another,
        with no handing over between them, and a caller of lower priority still goes first at the next call
        (the retrieval server ranks each request's first chunk 0, before the later chunks of all)."""
        jobs = [_Job(list(texts)) for texts in parts]
        with self._cond:
            if self._closed:
                raise RetrievalCancelled("the encoder is closed")
            for job, priority in zip(jobs, priorities, strict=True):
                heapq.heappush(self._queue, (priority, next(self._arrivals), job))
            while self._busy and not all(job.done for job in jobs):
                self._cond.wait()
            leader = not all(job.done for job in jobs)  # nobody else will encode the rest: this caller does
            if leader:
                self._busy = True
        if leader:
            try:
                while not all(job.done for job in jobs) and (batch := self._take()):
                    self._encode_batch(batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        rows: list[np.ndarray] = []
        for job in jobs:
            if job.error is not None:
                raise job.error
            assert job.vectors is not None
            rows.append(job.vectors)
        return rows

    def close(self) -> None:
        """Encode nothing more: queued callers and later ones get RetrievalCancelled."""
        with self._cond:
            self._closed = True
            for _, _, job in self._queue:
                job.error = RetrievalCancelled("the encoder was closed before these texts were encoded")
                job.done = True
            self._queue.clear()
            self._cond.notify_all()

    def _take(self) -> list[_Job]:
        """The first queued callers (by priority, then arrival), whole, up to `max_texts` texts (at least one)."""
        with self._cond:
            batch: list[_Job] = []
            count = 0
            while self._queue and (not batch or count + len(self._queue[0][2].texts) <= self.max_texts):
                job = heapq.heappop(self._queue)[2]
                batch.append(job)
                count += len(job.texts)
            return batch

    def _encode_batch(self, batch: list[_Job]) -> None:
        try:
            self._encode_into(batch)
        except Exception as exc:
            if len(batch) == 1:
                batch[0].error = exc
            else:  # one caller's bad input must not fail the others: encode each alone to find out
                for job in batch:
                    try:
                        self._encode_into([job])
                    except Exception as own:
                        job.error = own
        finally:
            with self._cond:
                for job in batch:  # even when interrupted, so no caller waits for rows that never come
                    if job.vectors is None and job.error is None:
                        job.error = RuntimeError("encoding was interrupted")
                    job.done = True
                self._cond.notify_all()

    def _encode_into(self, batch: list[_Job]) -> None:
        texts = [t for job in batch for t in job.texts]
        vectors = self._encode(texts)
        if len(vectors) != len(texts):
            raise ValueError(f"the encoder returned {len(vectors)} vectors for {len(texts)} texts")
        start = 0
        for job in batch:
            job.vectors = vectors[start:start + len(job.texts)]
            start += len(job.texts)


class DenseRetriever:
    """In-process dense retrieval over an index folder (`index.DenseIndex`).

    `encoder` maps texts to unit vectors of the index's dimension; by default the MiniLM encoder, created on
    first use (it imports torch, which the environment never does itself). Thread-safe: EnvPool threads and
    the server's request threads share one instance, and their concurrent queries are encoded together
    (`EncodeBatcher`).
    """

    def __init__(self, index_dir: str | os.PathLike[str],
                 encoder: Callable[[Sequence[str]], np.ndarray] | None = None, *, mmap: bool = True) -> None:
        from agentgym_opsd.environments.search_qa.index import DenseIndex

        self.index = DenseIndex(index_dir, mmap=mmap)
        self._encode = encoder
        self._batcher = EncodeBatcher(self._encode_now)

    def _encode_now(self, texts: Sequence[str]) -> np.ndarray:
        # only the batcher calls this, one thread at a time, so the lazy load needs no lock of its own
        if self._encode is None:
            from agentgym_opsd.environments.search_qa.embedding import shared_encoder

            self._encode = shared_encoder().encode
        return self._encode(texts)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of `texts`, encoded together with concurrent callers' (`EncodeBatcher`)."""
        return self._batcher(texts)

    def close(self) -> None:
        """Encode nothing more: retrievals waiting for the encoder, and later ones, raise RetrievalCancelled
        (the retrieval server calls this when it stops, so large requests in flight end at their next chunk)."""
        self._batcher.close()

    def encode_parts(self, parts: Sequence[Sequence[str]], priorities: Sequence[int]) -> np.ndarray:
        """Unit vectors of the texts of all `parts`, in order; each part is a caller of its own, at its
        priority, with the encoder (`EncodeBatcher.encode_parts`)."""
        return np.concatenate(self._batcher.encode_parts(parts, priorities))

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        _check_topk(topk)
        if not queries:
            return []
        return self.hits(*self.search(self.encode([clean_query(q) for q in queries]), topk))

    def search(self, vectors: np.ndarray, topk: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows) of the `topk` nearest passages of each vector (rows -1 where there are fewer).
        `retrieve` = `hits(*search(encode(cleaned queries), topk))`; the server runs the steps apart so that
        it can encode and answer a large request in chunks, and still search it in one call (FAISS scores
        depend, in their last bit, on which queries share a call)."""
        _check_topk(topk)
        return self.index.search(vectors, topk)

    def hits(self, scores: np.ndarray, rows: np.ndarray) -> list[list[SearchHit]]:
        """The passages of `search`'s (scores, rows), best first, one list per query."""
        store = self.index.store
        return [[SearchHit(store[int(r)], float(s)) for s, r in zip(qs, qr, strict=True) if r >= 0]
                for qs, qr in zip(scores, rows, strict=True)]


_CACHE: dict[Path, DenseRetriever] = {}
_CACHE_LOCK = threading.Lock()


def shared_dense_retriever(index_dir: str | os.PathLike[str]) -> DenseRetriever:
    """One `DenseRetriever` per index folder per process (the G environments of a pool share the index and
    the encoder instead of loading them G times)."""
    key = Path(index_dir).resolve()
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = DenseRetriever(key)
        return _CACHE[key]


class HttpRetriever:
    """Client of a Search-R1 style `POST /retrieve` server (stdlib only). A long list of queries goes out in
    several requests, each within the server's default limits (`MAX_QUERIES_PER_REQUEST`,
    `MAX_REQUEST_QUERY_CHARS`, `MAX_RESULTS_PER_REQUEST` passages = queries x topk). A server too busy to
    queue a request answers 503 with `Retry-After`; the request is sent again after that many seconds (at
    most `MAX_RETRY_AFTER_S`), up to `busy_retries` times."""

    MAX_RETRY_AFTER_S = 10.0

    def __init__(self, url: str, *, timeout_s: float = 30.0, busy_retries: int = 8) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever url must start with http:// or https://, got {url!r}")
        if busy_retries < 0:
            raise ValueError(f"busy_retries must be >= 0, got {busy_retries}")
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout_s = timeout_s
        self.busy_retries = busy_retries

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        _check_topk(topk)
        hits: list[list[SearchHit]] = []
        per_request = min(MAX_QUERIES_PER_REQUEST, max(1, MAX_RESULTS_PER_REQUEST // topk))
        for part in _request_sized([clean_query(q) for q in queries], per_request):
            hits.extend(self._retrieve_part(part, topk))
        return hits

    def _retrieve_part(self, queries: list[str], topk: int) -> list[list[SearchHit]]:
        body = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode("utf-8")
        payload = self._post(body)
        try:
            return [[SearchHit(Passage.from_contents(str(h["document"]["id"]), h["document"]["contents"]),
                               float(h.get("score", 0.0))) for h in hits] for hits in payload["result"]]
        except (KeyError, TypeError) as exc:
            raise RetrievalError(f"{self.url}: reply is not in /retrieve format ({exc})") from exc

    def _post(self, body: bytes) -> Any:
        """The decoded answer to `body`, sent again while the server answers 503 (busy), as it asks."""
        retries = 0
        while True:
            request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or retries >= self.busy_retries:
                    raise RetrievalError(f"{self.url} answered {exc.code}: {exc.read()[:300]!r}") from exc
                retries += 1
                time.sleep(_retry_after_s(exc.headers.get("Retry-After"), self.MAX_RETRY_AFTER_S))
            except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
                raise RetrievalError(f"{self.url}: {exc}") from exc


def _retry_after_s(header: str | None, most_s: float) -> float:
    """A `Retry-After` header in seconds, within [0, `most_s`]; 1 when it is missing or not a number."""
    try:
        seconds = float(header or 1)
    except ValueError:
        return 1.0
    return min(max(seconds, 0.0), most_s) if math.isfinite(seconds) else 1.0


def _request_sized(queries: list[str], max_queries: int) -> list[list[str]]:
    """`queries` in consecutive parts that the server accepts (at most `max_queries` queries and
    `MAX_REQUEST_QUERY_CHARS` characters per request)."""
    parts: list[list[str]] = []
    chars = 0
    for query in queries:
        if not parts or len(parts[-1]) >= max_queries or chars + len(query) > MAX_REQUEST_QUERY_CHARS:
            parts.append([])
            chars = 0
        parts[-1].append(query)
        chars += len(query)
    return parts
