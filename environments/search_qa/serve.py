"""A retrieval server with Search-R1's API, so many training workers share one index.

    python -m agentgym_opsd.environments.search_qa.serve --index idx/ --port 8000

`POST /retrieve` with `{"queries": [...], "topk": k, "return_scores": bool}` answers, as Search-R1's server
does, `{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` with `return_scores`, and bare
documents `{"result": [[{"id", "contents"}, ...], ...]}` without; a missing, null or 0 `topk` means 3.
`GET /health` answers `{"status": "ok", "num_passages": n}`.

Every refusal is JSON `{"error": message}`: malformed or hostile JSON (deep nesting, lone surrogates, NaN),
a missing or non-list `queries`, non-string queries, more than 1,024 queries, or `topk` outside [0, 100]
get 400; a body over 2 MiB or queries over 100,000 characters in total get 413; an unexpected failure is a
JSON 500. Concurrent requests are encoded together (`retriever.EncodeBatcher`). It binds 127.0.0.1 by
default and never runs Werkzeug's debugger, whatever FLASK_DEBUG says.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_opsd.environments.search_qa.retriever import (
    MAX_QUERIES_PER_REQUEST,
    MAX_REQUEST_QUERY_CHARS,
    MAX_TOPK,
    Retriever,
)
from agentgym_opsd.serving import BodyError, port_number, read_json_body, serve_until_interrupted

__all__ = ["create_app", "main", "DEFAULT_TOPK", "MAX_BODY_BYTES", "MAX_QUERIES_PER_REQUEST", "MAX_REQUEST_QUERY_CHARS"]

MAX_BODY_BYTES = 2 * 1024 * 1024
"""Room for MAX_REQUEST_QUERY_CHARS characters even when every one is JSON-escaped (up to 12 bytes each)."""


DEFAULT_TOPK = 3
"""Passages per query when a request gives no `topk` (Search-R1's launch default)."""


def _document(hit: Any) -> dict[str, str]:
    return {"id": hit.passage.id, "contents": hit.passage.contents}


def _validate(payload: Any, max_query_chars: int) -> tuple[list[str], int, bool]:
    if not isinstance(payload, dict):
        raise BodyError("body must be a JSON object with 'queries', 'topk' and 'return_scores'")
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BodyError("'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES_PER_REQUEST:
        raise BodyError(f"at most {MAX_QUERIES_PER_REQUEST} queries per request, got {len(queries)}")
    total = sum(len(q) for q in queries)
    if total > max_query_chars:
        raise BodyError(f"the queries hold {total} characters; at most {max_query_chars} per request are "
                        f"accepted (split them over several requests)", 413)
    topk = payload.get("topk") or DEFAULT_TOPK  # missing, null or 0: the default, as Search-R1's server does
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise BodyError(f"'topk' must be an integer in [1, {MAX_TOPK}] (0 or null = {DEFAULT_TOPK}), got {topk!r}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BodyError(f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, topk, return_scores


def create_app(retriever: Retriever, *, num_passages: int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_query_chars: int = MAX_REQUEST_QUERY_CHARS) -> Any:
    """The Flask app serving `retriever`."""
    from flask import Flask, jsonify, request
    from werkzeug.exceptions import HTTPException

    app = Flask("agentgym_opsd.search_qa")
    app.debug = False  # FLASK_DEBUG would make Flask re-raise errors past the JSON handlers below

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
        try:
            queries, topk, return_scores = _validate(read_json_body(request, max_bytes=max_body_bytes),
                                                     max_query_chars)
        except ValueError as exc:  # BodyError, or a limit of json itself (an integer of over 4,300 digits)
            return jsonify({"error": str(exc)}), getattr(exc, "status", 400)
        results = retriever.retrieve(queries, topk)
        # Search-R1's shapes: bare documents, or {"document", "score"} pairs when scores are asked for
        out = [[{"document": _document(h), "score": h.score} if return_scores else _document(h) for h in hits]
               for hits in results]
        return jsonify({"result": out})

    return app


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.environments.search_qa.serve",
                                description="Serve a Search-QA index with Search-R1's POST /retrieve")
    p.add_argument("--index", required=True, help="index folder (from build_index)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0 = any free port)")
    args = p.parse_args(argv)
    if not Path(args.index).is_dir():
        p.error(f"--index {args.index}: no such folder (build one with "
                f"python -m agentgym_opsd.environments.search_qa.build_index)")
    from agentgym_opsd.environments.search_qa.retriever import DenseRetriever

    try:
        retriever = DenseRetriever(args.index)
    except (OSError, ValueError, RuntimeError) as exc:  # not an index folder, or a damaged one
        p.error(f"--index {args.index}: {exc}")
    retriever.encode(["warm up"])  # load the encoder before the first request
    app = create_app(retriever, num_passages=len(retriever.index))
    serve_until_interrupted(app, args.host, args.port,
                            lambda url: f"serving {len(retriever.index)} passages of {args.index} on {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
