"""The shop as a web site (Flask), with isolated sessions that expire and are freed.

Browser routes (HTML):
    GET  /                          start page with a link to a new session
    GET  /new?split=train&goal=N    a page whose button starts a session for goal N of the split (random
                                    N when absent): a GET creates nothing
    POST /new                       form fields `split`, `goal`: create the session and redirect to its page
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

Sessions are kept in memory, at most `max_sessions` at once and `max_sessions_per_client` per client address
(a new one beyond either gets HTTP 503), and a session unused for `session_ttl_s` seconds is freed on the next
request. Only a POST creates one, so a crawler or a flood of GETs holds none.

Bodies are at most 64 KiB, chunked or not (413, never silently cut). JSON bodies are read by
`serving.read_json_body`: malformed JSON, deep nesting, lone surrogates or NaN get 400; an empty body
means `{}`. Errors on `/api/...` and `*.json` routes are JSON `{"error": ...}` (a 500 too), HTML elsewhere.
"""

from __future__ import annotations

import dataclasses
import io
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, abort, jsonify, redirect, request
from werkzeug.exceptions import HTTPException

from agentgym_opsd.environments.webshop.html import render_message, render_page, render_start
from agentgym_opsd.environments.webshop.models import Goal
from agentgym_opsd.environments.webshop.session import MAX_QUERY_CHARS, ShopSession
from agentgym_opsd.environments.webshop.shop import Shop
from agentgym_opsd.serving import BackgroundServer, HTTPLimits, read_json_body, wsgi_host

__all__ = ["SessionStore", "SessionLimitError", "create_app", "ShopServer", "MAX_BODY_BYTES", "LIMITS"]

_MAX_FORM_CHARS = 10_000
MAX_BODY_BYTES = 64 * 1024
"""Form posts and JSON bodies are tiny."""
LIMITS = HTTPLimits(max_body_bytes=MAX_BODY_BYTES)
"""The site's HTTP limits (`serving.host`): idle or trickling clients hold no worker and get a JSON 408, a
declared body over MAX_BODY_BYTES gets 413 at once, a stop answers newcomers 503 through its grace."""
_TOO_LARGE = "agentgym_opsd.body_too_large"


class SessionLimitError(RuntimeError):
    """Raised when the store already holds `max_sessions` live sessions."""


@dataclass
class _Entry:
    session: ShopSession
    last_used_s: float
    lock: threading.Lock
    client: str = ""


class SessionStore:
    """Thread-safe sessions by random id, with a time-to-live, a cap on their number and one per client."""

    def __init__(self, shop: Shop, *, session_ttl_s: float = 900.0, max_sessions: int = 512,
                 max_sessions_per_client: int = 64) -> None:
        if session_ttl_s <= 0 or max_sessions < 1 or max_sessions_per_client < 1:
            raise ValueError("session_ttl_s must be > 0, max_sessions and max_sessions_per_client >= 1")
        self.shop = shop
        self.session_ttl_s = session_ttl_s
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _sweep(self, now: float) -> None:
        expired = [sid for sid, e in self._entries.items() if now - e.last_used_s > self.session_ttl_s]
        for sid in expired:
            del self._entries[sid]

    def goals_of(self, split: str) -> list[Goal]:
        """The goals of `split`; ValueError for a split this shop does not have or that has none."""
        goals = self.shop.split_goals(split)
        if not goals:
            raise ValueError(f"split {split!r} of this shop has no goals")
        return goals

    def create(self, split: str, goal_index: int | None, client: str = "") -> str:
        """A new session for goal `goal_index` of `split` (random when None) held by `client` (its address)."""
        goals = self.goals_of(split)
        if goal_index is None:
            goal_index = secrets.randbelow(len(goals))
        if not 0 <= goal_index < len(goals):
            raise ValueError(f"goal must be in [0, {len(goals)}) for split {split!r}, got {goal_index}")
        now = time.monotonic()
        with self._lock:
            self._sweep(now)
            if len(self._entries) >= self.max_sessions:
                raise SessionLimitError(f"the shop already serves {self.max_sessions} sessions; close one first")
            held = sum(entry.client == client for entry in self._entries.values())
            if held >= self.max_sessions_per_client:
                raise SessionLimitError(f"this client holds {held} sessions already, the most one client may; "
                                        f"close one first (DELETE /api/sessions/<sid>)")
            sid = secrets.token_urlsafe(16)
            self._entries[sid] = _Entry(ShopSession(self.shop, goals[goal_index]), now, threading.Lock(), client)
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


class _BufferChunkedBodies:
    """WSGI middleware: a chunked body (no Content-Length) is read here, up to `max_bytes`, and handed on
    as a body of known length; a longer one is marked too large and not passed on. Werkzeug would
    otherwise cut a chunked body at MAX_CONTENT_LENGTH without a word (a form query or JSON body silently
    truncated) instead of refusing it."""

    def __init__(self, app: Callable[..., Iterable[bytes]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not environ.get("CONTENT_LENGTH"):
            body = self._read_at_most(environ["wsgi.input"], self.max_bytes + 1)
            if len(body) > self.max_bytes:
                environ[_TOO_LARGE] = True
                body = b""
            # from here on a plain body of known length (werkzeug ignores CONTENT_LENGTH while it sees chunked)
            environ["wsgi.input"] = io.BytesIO(body)
            environ["CONTENT_LENGTH"] = str(len(body))
            environ.pop("HTTP_TRANSFER_ENCODING")
            environ.pop("wsgi.input_terminated", None)
        return self.app(environ, start_response)

    @staticmethod
    def _read_at_most(stream: Any, limit: int) -> bytes:
        parts, size = [], 0
        while size < limit:  # some servers return short reads before the end of the body
            part = stream.read(limit - size)
            if not part:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)


def _json_object() -> dict[str, Any]:
    """The request's JSON object; an empty body is `{}` (every field has a default). Hostile bodies are
    refused with 400/413 (see serving.read_json_body) instead of being taken for `{}`."""
    if not request.content_length:  # none sent (chunked bodies have a length by now: _BufferChunkedBodies)
        return {}
    try:
        body = read_json_body(request, max_bytes=MAX_BODY_BYTES)
    except ValueError as exc:  # BodyError, or a limit of json itself (an integer of over 4,300 digits)
        abort(getattr(exc, "status", 400), description=str(exc))
    if not isinstance(body, dict):
        abort(400, description="expected a JSON object")
    return body


def create_app(shop: Shop, *, session_ttl_s: float = 900.0, max_sessions: int = 512,
               max_sessions_per_client: int = 64) -> Flask:
    """The Flask app over `shop`; `app.config["SESSIONS"]` is its SessionStore."""
    app = Flask("agentgym_opsd.webshop")
    app.debug = False  # FLASK_DEBUG would make Flask re-raise errors past the handlers below
    store = SessionStore(shop, session_ttl_s=session_ttl_s, max_sessions=max_sessions,
                         max_sessions_per_client=max_sessions_per_client)
    app.config["SESSIONS"] = store
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES  # declared lengths over it get 413 before any read
    app.wsgi_app = _BufferChunkedBodies(app.wsgi_app, MAX_BODY_BYTES)  # type: ignore[method-assign]

    def entry_or_404(sid: str) -> _Entry:
        entry = store.get(sid)
        if entry is None:
            abort(404, description="unknown or expired session")
        return entry

    def new_session(split: str, goal: int | None) -> str:
        try:
            return store.create(split, goal, request.remote_addr or "")
        except SessionLimitError as exc:
            abort(503, description=str(exc))
        except ValueError as exc:
            abort(400, description=str(exc))

    def error_page(code: int, description: str) -> tuple[Response | str, int]:
        if request.path.startswith("/api/") or request.path.endswith(".json"):
            return jsonify({"error": description}), code
        return render_message("WebShop", description, "/new", "start a new session"), code

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException) -> tuple[Response | str, int]:
        return error_page(exc.code or 500, str(exc.description))

    @app.errorhandler(Exception)
    def _internal_error(exc: Exception) -> tuple[Response | str, int]:
        app.logger.exception("%s %s failed", request.method, request.path)  # details to the log only
        return error_page(500, "internal error while answering the request")

    @app.before_request
    def _refuse_oversize_chunked_body() -> None:
        if request.environ.get(_TOO_LARGE):
            abort(413, description=f"the body is over {MAX_BODY_BYTES} bytes; at most {MAX_BODY_BYTES} "
                                   f"are accepted")

    @app.get("/healthz")
    def healthz() -> str:
        return "ok"

    @app.get("/")
    def index() -> str:
        return render_message("WebShop", f"{len(shop.products)} products.", "/new", "start shopping")

    @app.get("/new")
    def new_page() -> str:
        split, goal = request.args.get("split", "train"), request.args.get("goal", "")
        _int_or_none(goal)  # a goal that is not a number, or a split with no goals, is refused here already
        try:
            store.goals_of(split)
        except ValueError as exc:
            abort(400, description=str(exc))
        return render_start(f"{len(shop.products)} products; split {split}.", split, goal)

    @app.post("/new")
    def new() -> Response:
        sid = new_session(request.form.get("split", "train"), _int_or_none(request.form.get("goal")))
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
        body = _json_object()
        split, goal = body.get("split", "train"), body.get("goal")
        if not isinstance(split, str):
            abort(400, description=f"split must be a string, got {type(split).__name__}")
        if goal is not None and (not isinstance(goal, int) or isinstance(goal, bool)):  # JSON: no "1" for 1
            abort(400, description=f"goal must be an integer or null, got {type(goal).__name__}")
        sid = new_session(split, goal)
        entry = entry_or_404(sid)
        with entry.lock:
            return jsonify({"sid": sid, **_step_payload(entry, True, "")})

    @app.post("/api/sessions/<sid>/step")
    def api_step(sid: str) -> Response:
        action = _json_object().get("action", "")
        if not isinstance(action, str):  # a number or a list is a client bug, not an empty action
            abort(400, description=f"action must be a string, got {type(action).__name__}")
        entry = entry_or_404(sid)
        with entry.lock:
            result = entry.session.act(action)
            return jsonify(_step_payload(entry, result.valid, result.reason))

    @app.delete("/api/sessions/<sid>")
    def api_close(sid: str) -> Response:
        return jsonify({"closed": store.close(sid)})

    return app


class ShopServer:
    """The app served in a background thread (tests, browser mode, benchmarks), on the same HTTP host as
    `serve` runs it.

    `port=0` picks a free port; `url` is known at once (the socket is bound in the constructor, so the server
    accepts connections as soon as `start()` returns — no sleep needed)."""

    def __init__(self, shop: Shop, *, host: str = "127.0.0.1", port: int = 0, limits: HTTPLimits = LIMITS,
                 **app_kwargs: float) -> None:
        self.app = create_app(shop, **app_kwargs)  # type: ignore[arg-type]
        self._server = BackgroundServer(wsgi_host(self.app, limits), host, port, name="webshop-server")
        self.url = self._server.url

    @property
    def sessions(self) -> SessionStore:
        return self.app.config["SESSIONS"]

    def start(self) -> ShopServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> ShopServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
