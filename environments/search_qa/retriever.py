"""Retrievers: queries in, top-k passages out; in-process (FAISS + MiniLM) or over HTTP.

Both speak the same `retrieve(queries, topk)`; the environment holds either. The HTTP client talks to
`serve.py` (or any server with Search-R1's `POST /retrieve`), so many training workers can share one index.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentgym_opsd.environments.search_qa.data import Passage

__all__ = ["SearchHit", "Retriever", "DenseRetriever", "HttpRetriever", "RetrievalError", "clean_query",
           "MAX_QUERY_CHARS", "MAX_TOPK", "shared_dense_retriever"]

MAX_QUERY_CHARS = 2_000
"""Queries are cut to this many characters (the encoder reads only 256 tokens anyway)."""
MAX_TOPK = 100


class RetrievalError(RuntimeError):
    """The retriever could not answer (server down, bad reply)."""


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


class DenseRetriever:
    """In-process dense retrieval over an index folder (`index.DenseIndex`).

    `encoder` maps texts to unit vectors of the index's dimension; by default the MiniLM encoder, created on
    first use (it imports torch, which the environment never does itself). Thread-safe: EnvPool threads
    share one instance.
    """

    def __init__(self, index_dir: str | os.PathLike[str],
                 encoder: Callable[[Sequence[str]], np.ndarray] | None = None, *, mmap: bool = True) -> None:
        from agentgym_opsd.environments.search_qa.index import DenseIndex

        self.index = DenseIndex(index_dir, mmap=mmap)
        self._encode = encoder
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self._encode is None:
                from agentgym_opsd.environments.search_qa.embedding import shared_encoder

                self._encode = shared_encoder().encode
            return self._encode(texts)

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        _check_topk(topk)
        if not queries:
            return []
        vectors = self.encode([clean_query(q) for q in queries])
        scores, rows = self.index.search(vectors, topk)
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
    """Client of a Search-R1 style `POST /retrieve` server (stdlib only)."""

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retriever url must start with http:// or https://, got {url!r}")
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout_s = timeout_s

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        _check_topk(topk)
        if not queries:
            return []
        body = json.dumps({"queries": [clean_query(q) for q in queries], "topk": topk,
                           "return_scores": True}).encode("utf-8")
        request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload: Any = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise RetrievalError(f"{self.url} answered {exc.code}: {exc.read()[:300]!r}") from exc
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise RetrievalError(f"{self.url}: {exc}") from exc
        try:
            return [[SearchHit(Passage.from_contents(str(h["document"]["id"]), h["document"]["contents"]),
                               float(h.get("score", 0.0))) for h in hits] for hits in payload["result"]]
        except (KeyError, TypeError) as exc:
            raise RetrievalError(f"{self.url}: reply is not in /retrieve format ({exc})") from exc
