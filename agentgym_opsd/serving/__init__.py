"""Serving over HTTP: the kit the servers (shop site, retrieval server, the policy server in
`agentgym_opsd.models.policy_server`) share. It stands on the standard library and werkzeug alone.

- `bodies`: reading a JSON request body that cannot hurt the server (hostile bodies get a JSON 400/413);
- `cli`: numeric command-line argument types and serving an app in the foreground;
- `pool`: a server with a fixed pool of worker threads, refusing connections beyond its queue with 503 and
  letting its requests in progress end (or cancelling them) when it stops;
- `connections`: the pool's connection thread, which reads each request whole (deadlines on the head and
  the body, a cap on connections being read) so that slow clients hold no worker.
"""

from __future__ import annotations

from agentgym_opsd.serving.bodies import MAX_JSON_DEPTH, BodyError, parse_json_text, read_json_body
from agentgym_opsd.serving.cli import (
    add_pool_arguments,
    non_negative_float,
    non_negative_int,
    number_type,
    pool_from_args,
    port_number,
    positive_float,
    positive_int,
    serve_until_interrupted,
    stop_on_sigint_and_sigterm,
)
from agentgym_opsd.serving.pool import PooledWSGIServer, WorkerPool

__all__ = ["add_pool_arguments", "BodyError", "MAX_JSON_DEPTH", "non_negative_float", "non_negative_int",
           "number_type", "parse_json_text", "pool_from_args", "PooledWSGIServer", "port_number", "positive_float",
           "positive_int", "read_json_body", "serve_until_interrupted", "stop_on_sigint_and_sigterm", "WorkerPool"]
