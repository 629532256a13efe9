"""A retrieval server with Search-R1's API, so many training workers share one index.

    python -m agentgym_opsd.environments.search_qa.serve --index idx/ --port 8000

`POST /retrieve` with `{"queries": [...], "topk": k, "return_scores": bool}` answers, as Search-R1's server
does, `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` with `return_scores`, and bare
documents `{"result": [[{"id", "contents"}, ...], ...]}` without; a missing, null or 0 `topk` means 3.
`GET /health` answers `{"status": "ok", "num_passages": n}`.

Every refusal is JSON `{"error": message}`: malformed or hostile JSON (deep nesting, lone surrogates, NaN),
a missing or non-list `queries` or non-string queries get 400. The work one request may ask for is bounded
(`RetrieveLimits`, each a command-line flag); a refusal for a limit also says which, as
`{"error", "limit", "max"}`: more than `max_queries` (1,024) queries or a `topk` outside [1, `max_topk`
(100)] get 400; a body over `max_body_bytes` (2 MiB), queries over `max_query_chars` (100,000) characters in
total, or more than `max_results` (10,240) passages in all (queries x topk) get 413. An unexpected failure
is a JSON 500. It binds 127.0.0.1 by default and never runs Werkzeug's debugger, whatever FLASK_DEBUG says.

Concurrency is bounded too (`agentgym_opsd.serving.host`, on uvicorn): `--workers` (32) threads answer
requests, up to `--max-pending` (128) requests read whole wait for one, and one beyond that gets a JSON 503 with
`Retry-After: 1` (`{"error", "limit": "max_pending", "max"}`) at once; `HttpRetriever` waits and retries. A flood
of connections therefore never starts more threads than that, and requests waiting are answered once the workers
are free (the fairness below holds among the requests being answered). A request is read whole on the event loop
before a worker takes it, so clients that send nothing or trickle their bytes hold no worker: up to
`--max-connections` (512) connections are open at once (one more: 503 `max_connections`), and a request head that
takes over `--header-timeout` (10 s), or a body over `--body-timeout` (30 s), gets a JSON 408.

SIGINT or SIGTERM stops the server: new requests get 503 with Retry-After (which `HttpRetriever` retries), the
requests in progress get `--shutdown-grace` (5 s) to end, then the rest are cancelled at their next chunk (each
answered 503 with Retry-After); it waits for its workers and exits 0.

Fairness: a request is encoded `chunk_queries` (64) queries at a time through `retriever.EncodeBatcher`,
which merges concurrent callers' texts (up to 64 a call) and takes the first chunk of any request before
the later chunks of all (those in order of arrival: large requests run one after another, not
interleaved), so a small request waits for at most the encoder call in progress (one chunk), never for a
whole large request. The request is then searched in one FAISS call (which releases the GIL, so others go
on meanwhile; one call keeps the scores exactly those of `retriever.retrieve`), and its passages are read
and written out as JSON a chunk per turn of a `scheduler.FairScheduler`, in the same order: a small request
waits for at most the turn in progress. The answer is the very bytes `jsonify` would write.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.search_qa.retriever import (
    MAX_QUERIES_PER_REQUEST,
    MAX_REQUEST_QUERY_CHARS,
    MAX_RESULTS_PER_REQUEST,
    MAX_TOPK,
    DenseRetriever,
    RetrievalCancelled,
    Retriever,
    SearchHit,
    clean_query,
)
from agentgym_opsd.environments.search_qa.scheduler import FairScheduler, Ticket
from agentgym_opsd.serving import (
    BodyError,
    HTTPLimits,
    add_limit_arguments,
    limits_from_args,
    number_type,
    port_number,
    positive_int,
    read_json_body,
    serve,
    wsgi_host,
)

__all__ = ["create_app", "main", "CHUNK_QUERIES", "DEFAULT_TOPK", "LimitError", "MAX_BODY_BYTES",
           "MAX_QUERIES_PER_REQUEST", "MAX_REQUEST_QUERY_CHARS", "MAX_RESULTS_PER_REQUEST", "RetrieveLimits"]

MAX_BODY_BYTES = 2 * 1024 * 1024
"""Room for MAX_REQUEST_QUERY_CHARS characters even when every one is JSON-escaped (up to 12 bytes each)."""

DEFAULT_TOPK = 3
"""Passages per query when a request gives no `topk` (Search-R1's launch default)."""

CHUNK_QUERIES = 64
"""Queries per chunk of a request's work: a multiple of the MiniLM encoder's batch (64), so a request
encoded alone goes through the very batches it would in one call."""


@dataclass(frozen=True)
class RetrieveLimits:
    """What one `POST /retrieve` may ask for, and how its work is cut for fairness. The defaults are the
    module constants of `retriever` that `HttpRetriever` keeps to, so the project's own clients (and
    Search-R1's, which send topk 3) never meet them; one request is at most 1,024 queries, or 10,240
    passages, where the request that found the need was 1,024 x 100 passages (22.9 MB)."""

    max_queries: int = MAX_QUERIES_PER_REQUEST
    max_topk: int = MAX_TOPK
    max_results: int = MAX_RESULTS_PER_REQUEST
    """Passages in the whole answer: queries x topk."""
    max_query_chars: int = MAX_REQUEST_QUERY_CHARS
    max_body_bytes: int = MAX_BODY_BYTES
    chunk_queries: int = CHUNK_QUERIES
    """Queries per encoder call and per scheduler turn (>= max_queries: a request is one chunk)."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"RetrieveLimits.{field.name} must be an integer >= 1, got {value!r}")
        if self.max_topk > MAX_TOPK:
            raise ValueError(f"RetrieveLimits.max_topk must be at most {MAX_TOPK} (the retriever's own bound), "
                             f"got {self.max_topk}")


class LimitError(BodyError):
    """A request over one of the `RetrieveLimits`: answered `{"error", "limit": name, "max": value}`."""

    def __init__(self, message: str, limit: str, maximum: int, status: int = 400) -> None:
        super().__init__(f"{message} (limit {limit})", status)
        self.limit = limit
        self.maximum = maximum


def _document(hit: SearchHit) -> dict[str, str]:
    return {"id": hit.passage.id, "contents": hit.passage.contents}


def _validate(payload: Any, limits: RetrieveLimits) -> tuple[list[str], int, bool]:
    if not isinstance(payload, dict):
        raise BodyError("body must be a JSON object with 'queries', 'topk' and 'return_scores'")
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BodyError("'queries' must be a list of strings")
    if len(queries) > limits.max_queries:
        raise LimitError(f"at most {limits.max_queries} queries per request, got {len(queries)} (split them over "
                         f"several requests)", "max_queries", limits.max_queries)
    total = sum(len(q) for q in queries)
    if total > limits.max_query_chars:
        raise LimitError(f"the queries hold {total} characters; at most {limits.max_query_chars} per request are "
                         f"accepted (split them over several requests)", "max_query_chars", limits.max_query_chars,
                         413)
    topk = payload.get("topk") or DEFAULT_TOPK  # missing, null or 0: the default, as Search-R1's server does
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= limits.max_topk:
        raise LimitError(f"'topk' must be an integer in [1, {limits.max_topk}] (0 or null = {DEFAULT_TOPK}), "
                         f"got {topk!r}", "max_topk", limits.max_topk)
    if len(queries) * topk > limits.max_results:
        raise LimitError(f"{len(queries)} queries x topk {topk} = {len(queries) * topk} passages; at most "
                         f"{limits.max_results} per request are answered (split the queries over several requests "
                         f"or ask for fewer passages each)", "max_results", limits.max_results, 413)
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BodyError(f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, topk, return_scores


def _hits_by_chunk(retriever: Retriever, queries: list[str], topk: int, chunk: int,
                   ticket: Ticket) -> Callable[[int], list[list[SearchHit]]]:
    """Runs the search of `queries` and returns `hits(start)`: the hits of queries[start:start + chunk].
    A DenseRetriever is encoded a chunk per call, at the encoder priority `ticket.rank(i)` for chunk i (any
    request's first chunk before the later ones of all, those in order of arrival), then searched in one
    call, then read a chunk at a time; any other retriever answers in one `retrieve`."""
    if isinstance(retriever, DenseRetriever):
        cleaned = [clean_query(q) for q in queries]
        starts = range(0, len(cleaned), chunk)
        vectors = retriever.encode_parts([cleaned[start:start + chunk] for start in starts],
                                         [ticket.rank(i) for i in range(len(starts))])
        scores, rows = retriever.search(vectors, topk)
        return lambda start: retriever.hits(scores[start:start + chunk], rows[start:start + chunk])
    results = retriever.retrieve(queries, topk)
    return lambda start: results[start:start + chunk]


def _answer(retriever: Retriever, queries: list[str], topk: int, return_scores: bool, *, chunk: int,
            scheduler: FairScheduler, ticket: Ticket, dumps: Callable[[Any], str]) -> str:
    """The body `jsonify({"result": ...})` would write, read and written a chunk per scheduler turn."""
    if not queries:
        return '{"result":[]}\n'
    hits_of = _hits_by_chunk(retriever, queries, topk, chunk, ticket)
    parts: list[str] = []
    for start in range(0, len(queries), chunk):
        with scheduler.turn(ticket):
            # Search-R1's shapes: bare documents, or {"document", "score"} pairs when scores are asked for
            parts.extend(dumps([{"document": _document(h), "score": h.score} if return_scores else _document(h)
                                for h in hits]) for hits in hits_of(start))
    return '{"result":[' + ",".join(parts) + "]}\n"


def create_app(retriever: Retriever, limits: RetrieveLimits | None = None, *, num_passages: int | None = None,
               scheduler: FairScheduler | None = None) -> Any:
    """The Flask app serving `retriever` within `limits` (default `RetrieveLimits()`); `scheduler` hands out
    the turns of its requests (a new one by default). `app.extensions["cancel_in_flight"]()` makes the
    requests in progress end at their next chunk, answered 503 (for a server that stops)."""
    from flask import Flask, jsonify, request
    from werkzeug.exceptions import HTTPException

    limits = limits or RetrieveLimits()
    scheduler = scheduler or FairScheduler()
    app = Flask("agentgym_opsd.search_qa")
    app.debug = False  # FLASK_DEBUG would make Flask re-raise errors past the JSON handlers below

    def dumps(value: Any) -> str:  # as jsonify writes it (sorted keys, compact) when not debugging
        return app.json.dumps(value, separators=(",", ":"))

    def cancel_in_flight() -> None:
        scheduler.close()
        if isinstance(retriever, DenseRetriever):  # its encoder queue; any other retriever answers in one call
            retriever.close()

    app.extensions["cancel_in_flight"] = cancel_in_flight

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:  # 404, 405, ...: JSON like every other answer
        return jsonify({"error": exc.description}), exc.code

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Any:
        app.logger.exception("%s %s failed", request.method, request.path)  # traceback to the log, not the client
        return jsonify({"error": "internal error while answering the request"}), 500

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "num_passages": num_passages})

    @app.post("/retrieve")
    def retrieve() -> Any:
        ticket = scheduler.ticket()  # its place among the requests in flight is its arrival
        try:
            try:
                payload = read_json_body(request, max_bytes=limits.max_body_bytes)
            except BodyError as exc:
                if exc.status == 413:
                    raise LimitError(str(exc), "max_body_bytes", limits.max_body_bytes, 413) from None
                raise
            queries, topk, return_scores = _validate(payload, limits)
        except ValueError as exc:  # BodyError, or a limit of json itself (an integer of over 4,300 digits)
            named = {"limit": exc.limit, "max": exc.maximum} if isinstance(exc, LimitError) else {}
            return jsonify({"error": str(exc), **named}), getattr(exc, "status", 400)
        try:
            body = _answer(retriever, queries, topk, return_scores, chunk=limits.chunk_queries, scheduler=scheduler,
                           ticket=ticket, dumps=dumps)
        except RetrievalCancelled:
            return jsonify({"error": "the server is stopping: the request was cancelled"}), 503, {"Retry-After": "1"}
        return app.response_class(body, mimetype=app.json.mimetype)

    return app


def main(argv: Sequence[str] | None = None) -> int:
    defaults = RetrieveLimits()
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.environments.search_qa.serve",
                                description="Serve a Search-QA index with Search-R1's POST /retrieve")
    p.add_argument("--index", required=True, help="index folder (from build_index)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0 = any free port)")
    limits = p.add_argument_group("per-request limits (over one: a JSON 400/413 naming it)")
    limits.add_argument("--max-queries", type=positive_int, default=defaults.max_queries,
                        help=f"queries per request (default {defaults.max_queries})")
    limits.add_argument("--max-topk", type=number_type(int, lambda v: 1 <= v <= MAX_TOPK, f"in [1, {MAX_TOPK}]"),
                        default=defaults.max_topk, help=f"largest topk (default {defaults.max_topk})")
    limits.add_argument("--max-results", type=positive_int, default=defaults.max_results,
                        help=f"passages per request, queries x topk (default {defaults.max_results})")
    limits.add_argument("--max-query-chars", type=positive_int, default=defaults.max_query_chars,
                        help=f"characters of all queries of a request (default {defaults.max_query_chars})")
    limits.add_argument("--max-body-bytes", type=positive_int, default=defaults.max_body_bytes,
                        help=f"request body size (default {defaults.max_body_bytes})")
    limits.add_argument("--chunk-queries", type=positive_int, default=defaults.chunk_queries,
                        help=f"queries a request works on per turn, so small requests slip in between "
                             f"(default {defaults.chunk_queries})")
    add_limit_arguments(p, HTTPLimits())
    args = p.parse_args(argv)
    if not Path(args.index).is_dir():
        p.error(f"--index {args.index}: no such folder (build one with "
                f"python -m agentgym_opsd.environments.search_qa.build_index)")
    limits = RetrieveLimits(max_queries=args.max_queries, max_topk=args.max_topk, max_results=args.max_results,
                            max_query_chars=args.max_query_chars, max_body_bytes=args.max_body_bytes,
                            chunk_queries=args.chunk_queries)
    # the class is looked up now, not at import: tests put a stand-in into the retriever module
    from agentgym_opsd.environments.search_qa import retriever as retrieval

    try:
        retriever = retrieval.DenseRetriever(args.index)
    except (OSError, ValueError, RuntimeError) as exc:  # not an index folder, or a damaged one
        p.error(f"--index {args.index}: {exc}")
    retriever.encode(["warm up"])  # load the encoder before the first request
    app = create_app(retriever, limits, num_passages=len(retriever.index))
    http = limits_from_args(args, HTTPLimits(max_body_bytes=limits.max_body_bytes))
    serve(wsgi_host(app, http, cancel_in_flight=app.extensions["cancel_in_flight"]), args.host, args.port,
          lambda url: f"serving {len(retriever.index)} passages of {args.index} on {url} "
                      f"(per request: <= {limits.max_queries} queries, topk <= {limits.max_topk}, "
                      f"<= {limits.max_results} passages; {http.workers} workers, <= {http.max_pending} waiting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
