"""Serving over HTTP: the kit the servers (shop site, retrieval server, the policy server in
`agentgym_opsd.models.policy_server`, the OpenEnv server) share.

- `host`: the one HTTP server they run on, uvicorn, with its limits (`HTTPLimits`) and guards: deadlines on the
  head and the body (a JSON 408), bodies read whole before the app sees them (a JSON 413 over the limit), a cap on
  requests in progress and on connections (a JSON 503 with Retry-After), a drain at SIGINT/SIGTERM;
- `bodies`: reading a JSON request body that cannot hurt the server (hostile bodies get a JSON 400/413);
- `cli`: numeric command-line argument types and the host's limit flags.
"""

from __future__ import annotations

from agentgym_opsd.serving.bodies import MAX_JSON_DEPTH, BodyError, parse_json_text, read_json_body
from agentgym_opsd.serving.cli import (
    add_limit_arguments,
    limits_from_args,
    non_negative_float,
    non_negative_int,
    number_type,
    port_number,
    positive_float,
    positive_int,
    stop_on_sigint_and_sigterm,
)
from agentgym_opsd.serving.host import BackgroundServer, GuardedHTTP, HTTPLimits, serve, wsgi_host

__all__ = ["add_limit_arguments", "BackgroundServer", "BodyError", "GuardedHTTP", "HTTPLimits", "limits_from_args",
           "MAX_JSON_DEPTH", "non_negative_float", "non_negative_int", "number_type", "parse_json_text",
           "port_number", "positive_float", "positive_int", "read_json_body", "serve", "stop_on_sigint_and_sigterm",
           "wsgi_host"]
