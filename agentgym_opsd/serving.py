"""Run a WSGI app (the shop site, the policy server) in the foreground until Ctrl-C."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.serving import make_server

__all__ = ["serve_until_interrupted"]


def serve_until_interrupted(app: Any, host: str, port: int, banner: Callable[[str], str]) -> None:
    """Bind `host:port` (port 0 picks a free one), print `banner(url)` with the bound address, serve
    threaded until interrupted, then close the socket."""
    server = make_server(host, port, app, threaded=True)
    print(banner(f"http://{host}:{server.server_port}"), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
