"""A retrieval server with Search-R1's API, so many training workers share one index.

    python -m agentgym_opsd.environments.search_qa.serve --index idx/ --port 8000

`POST /retrieve` with `{"queries": [...], "topk": k, "return_scores": bool}` answers
`{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}` (without `score` when
`return_scores` is false). Malformed JSON, a missing or non-list `queries`, non-string queries, or `topk`
outside [1, 100] get HTTP 400 with a message. `GET /health` answers `{"status": "ok", "num_passages": n}`.
It binds 127.0.0.1 by default.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from agentgym_opsd.environments.search_qa.retriever import MAX_TOPK, Retriever

__all__ = ["create_app", "main", "MAX_QUERIES_PER_REQUEST"]

MAX_QUERIES_PER_REQUEST = 1_024


class _BadRequest(ValueError):
    pass


def _validate(payload: Any) -> tuple[list[str], int, bool]:
    if not isinstance(payload, dict):
        raise _BadRequest("body must be a JSON object with 'queries', 'topk' and 'return_scores'")
    queries = payload.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise _BadRequest("'queries' must be a list of strings")
    if len(queries) > MAX_QUERIES_PER_REQUEST:
        raise _BadRequest(f"at most {MAX_QUERIES_PER_REQUEST} queries per request, got {len(queries)}")
    topk = payload.get("topk", 3)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise _BadRequest(f"'topk' must be an integer in [1, {MAX_TOPK}], got {topk!r}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise _BadRequest(f"'return_scores' must be true or false, got {return_scores!r}")
    return queries, topk, return_scores


def create_app(retriever: Retriever, *, num_passages: int | None = None) -> Any:
    """The Flask app serving `retriever`."""
    from flask import Flask, jsonify, request

    app = Flask("agentgym_opsd.search_qa")

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "num_passages": num_passages})

    @app.post("/retrieve")
    def retrieve() -> Any:
        # get_json(silent=True) gives None for malformed or non-UTF-8 bodies instead of Flask's HTML 400
        payload = request.get_json(force=True, silent=True)
        try:
            queries, topk, return_scores = _validate(payload)
        except _BadRequest as exc:
            return jsonify({"error": str(exc)}), 400
        results = retriever.retrieve(queries, topk)
        out = [[{"document": {"id": h.passage.id, "contents": h.passage.contents},
                 **({"score": h.score} if return_scores else {})} for h in hits] for hits in results]
        return jsonify({"result": out})

    return app


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.environments.search_qa.serve",
                                description="Serve a Search-QA index with Search-R1's POST /retrieve")
    p.add_argument("--index", required=True, help="index folder (from build_index)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--port", type=int, default=8000)
    args = p.parse_args(argv)
    from agentgym_opsd.environments.search_qa.retriever import DenseRetriever

    retriever = DenseRetriever(args.index)
    retriever.encode(["warm up"])  # load the encoder before the first request
    app = create_app(retriever, num_passages=len(retriever.index))
    app.run(host=args.host, port=args.port, threaded=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
