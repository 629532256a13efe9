"""The shop as a web site (Flask), with isolated sessions that expire and are freed.

Browser routes (HTML):
    GET  /                          start page with a link to a new session
    GET  /new?split=train&goal=N    create a session for goal N of the split (random N when absent) and
                                    redirect to its page
    GET  /s/<sid>/                  the session's current page
    POST /s/<sid>/search            form field `query`: search[query]
    POST /s/<sid>/click             form field `name`: click[name]
    POST /s/<sid>/close             free the session
JSON routes (programs, tests and the browser adapter's oracle):
    POST /api/sessions              {"split", "goal"} -> {"sid", "observation", "admissible_actions"}
    POST /api/sessions/<sid>/step   {"action"} -> {"observation", "valid", "reason", "done", "score", ...}
    GET  /s/<sid>/state.json        the session view (page kind, asins on the page, chosen options, score)
    DELETE /api/sessions/<sid>      free the session
    GET  /healthz                   "ok" (readiness probe)

Sessions are kept in memory, at most `max_sessions` at once (a new one beyond that gets HTTP 503), and a
session unused for `session_ttl_s` seconds is freed on the next request.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from dataclasses import dataclass

from flask import Flask, Response, abort, jsonify, redirect, request
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from agentgym_opsd.environments.webshop.html import render_message, render_page
from agentgym_opsd.environments.webshop.session import MAX_QUERY_CHARS, ShopSession
from agentgym_opsd.environments.webshop.shop import Shop

__all__ = ["SessionStore", "SessionLimitError", "create_app", "ShopServer"]

_MAX_FORM_CHARS = 10_000


class SessionLimitError(RuntimeError):
    """Raised when the store already holds `max_sessions` live sessions."""


@dataclass
class _Entry:
    session: ShopSession
    last_used_s: float
    lock: threading.Lock


class SessionStore:
    """Thread-safe sessions by random id, with a time-to-live and a cap on their number."""

    def __init__(self, shop: Shop, *, session_ttl_s: float = 900.0, max_sessions: int = 512) -> None:
        if session_ttl_s <= 0 or max_sessions < 1:
            raise ValueError("session_ttl_s must be > 0 and max_sessions >= 1")
        self.shop = shop
        self.session_ttl_s = session_ttl_s
        self.max_sessions = max_sessions
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _sweep(self, now: float) -> None:
        expired = [sid for sid, e in self._entries.items() if now - e.last_used_s > self.session_ttl_s]
        for sid in expired:
            del self._entries[sid]

    def create(self, split: str, goal_index: int | None) -> str:
        goals = self.shop.split_goals(split)
        if goal_index is None:
            goal_index = secrets.randbelow(len(goals))
        if not 0 <= goal_index < len(goals):
            raise ValueError(f"goal must be in [0, {len(goals)}) for split {split!r}, got {goal_index}")
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            if len(self._entries) >= self.max_sessions:
                raise SessionLimitError(f"the shop already serves {self.max_sessions} sessions; close one first")
            sid = secrets.token_urlsafe(16)
            self._entries[sid] = _Entry(ShopSession(self.shop, goals[goal_index]), now, threading.Lock())
        return sid

    def get(self, sid: str) -> _Entry | None:
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            entry = self._entries.get(sid)
            if entry is not None:
                entry.last_used_s = now
            return entry

    def close(self, sid: str) -> bool:
        with self._lock:
            return self._entries.pop(sid, None) is not None


def _int_or_none(value: object) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(str(value))
    except ValueError:
        abort(400, description=f"goal must be an integer, got {str(value)[:40]!r}")


def _step_payload(entry: _Entry, valid: bool, reason: str) -> dict[str, object]:
    session = entry.session
    page = session.page()
    return {"observation": page.observation(), "valid": valid, "reason": reason, "done": session.done,
            "score": session.score, "page": page.kind, "admissible_actions": session.admissible_actions(page)}


def create_app(shop: Shop, *, session_ttl_s: float = 900.0, max_sessions: int = 512) -> Flask:
    """The Flask app over `shop`; `app.config["SESSIONS"]` is its SessionStore."""
    app = Flask("agentgym_opsd.webshop")
    store = SessionStore(shop, session_ttl_s=session_ttl_s, max_sessions=max_sessions)
    app.config["SESSIONS"] = store
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024  # form posts and JSON bodies are tiny

    def entry_or_404(sid: str) -> _Entry:
        entry = store.get(sid)
        if entry is None:
            abort(404, description="unknown or expired session")
        return entry

    def new_session(split: str, goal: int | None) -> str:
        try:
            return store.create(split, goal)
        except SessionLimitError as exc:
            abort(503, description=str(exc))
        except ValueError as exc:
            abort(400, description=str(exc))

    @app.errorhandler(400)
    @app.errorhandler(404)
    @app.errorhandler(413)
    @app.errorhandler(503)
    def _error(exc: object) -> tuple[Response | str, int]:
        code = getattr(exc, "code", 500)
        description = str(getattr(exc, "description", "error"))
        if request.path.startswith("/api/") or request.path.endswith(".json"):
            return jsonify({"error": description}), code
        return render_message("WebShop", description, "/new", "start a new session"), code

    @app.get("/healthz")
    def healthz() -> str:
        return "ok"

    @app.get("/")
    def index() -> str:
        return render_message("WebShop", f"{len(shop.products)} products.", "/new", "start shopping")

    @app.get("/new")
    def new() -> Response:
        sid = new_session(request.args.get("split", "train"), _int_or_none(request.args.get("goal")))
        return redirect(f"/s/{sid}/", code=303)  # type: ignore[return-value]

    @app.get("/s/<sid>/")
    def page(sid: str) -> str:
        entry = entry_or_404(sid)
        with entry.lock:
            return render_page(entry.session.page(), f"/s/{sid}", MAX_QUERY_CHARS)

    def act_and_redirect(sid: str, action: str) -> Response:
        entry = entry_or_404(sid)
        with entry.lock:
            entry.session.act(action)
        return redirect(f"/s/{sid}/", code=303)  # type: ignore[return-value]

    @app.post("/s/<sid>/search")
    def search(sid: str) -> Response:
        return act_and_redirect(sid, f"search[{request.form.get('query', '')[:_MAX_FORM_CHARS]}]")

    @app.post("/s/<sid>/click")
    def click(sid: str) -> Response:
        return act_and_redirect(sid, f"click[{request.form.get('name', '')[:_MAX_FORM_CHARS]}]")

    @app.post("/s/<sid>/close")
    def close(sid: str) -> str:
        store.close(sid)
        return render_message("WebShop", "Session closed.", "/new", "start a new session")

    @app.get("/s/<sid>/state.json")
    def state(sid: str) -> Response:
        entry = entry_or_404(sid)
        with entry.lock:
            view = dataclasses.asdict(entry.session.view())
            return jsonify({**view, "score": entry.session.score, "goal_id": entry.session.goal.goal_id})

    @app.post("/api/sessions")
    def api_create() -> Response:
        body = request.get_json(silent=True) or {}
        if not isinstance(body, dict):
            abort(400, description="expected a JSON object")
        sid = new_session(str(body.get("split", "train")), _int_or_none(body.get("goal")))
        entry = entry_or_404(sid)
        with entry.lock:
            return jsonify({"sid": sid, **_step_payload(entry, True, "")})

    @app.post("/api/sessions/<sid>/step")
    def api_step(sid: str) -> Response:
        body = request.get_json(silent=True) or {}
        action = body.get("action", "") if isinstance(body, dict) else ""
        entry = entry_or_404(sid)
        with entry.lock:
            result = entry.session.act(action if isinstance(action, str) else "")
            return jsonify(_step_payload(entry, result.valid, result.reason))

    @app.delete("/api/sessions/<sid>")
    def api_close(sid: str) -> Response:
        return jsonify({"closed": store.close(sid)})

    return app


class _QuietHandler(WSGIRequestHandler):
    """No per-request access log (tests and benchmarks send thousands of requests)."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return None


class ShopServer:
    """The app served by werkzeug in a background thread (tests, browser mode, benchmarks).

    `port=0` picks a free port; `url` is known once `start()` returns (the socket is bound before the
    thread starts, so the server accepts connections immediately — no sleep needed)."""

    def __init__(self, shop: Shop, *, host: str = "127.0.0.1", port: int = 0, **app_kwargs: float) -> None:
        self.app = create_app(shop, **app_kwargs)  # type: ignore[arg-type]
        self._server: BaseWSGIServer = make_server(host, port, self.app, threaded=True,
                                                   request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webshop-server", daemon=True)
        self.url = f"http://{host}:{self._server.server_port}"

    @property
    def sessions(self) -> SessionStore:
        return self.app.config["SESSIONS"]

    def start(self) -> ShopServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> ShopServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
