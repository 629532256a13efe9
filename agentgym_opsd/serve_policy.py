"""`python -m agentgym_opsd.serve_policy MODEL --port P`: a local HF model behind an OpenAI-compatible API.

    python -m agentgym_opsd.serve_policy embedded:smollm2-135m-instruct --port 8000
    python -m agentgym_opsd.evaluate --policy openai:http://127.0.0.1:8000 --env ALFWorld-v0:valid_unseen --out runs/x

MODEL is anything `load_policy_model` accepts (`embedded:smollm2-135m-instruct`, `tiny-random`, a local
folder, a LoRA adapter, a trainer checkpoint); an `hf:` prefix is allowed. Endpoints:

- `GET /v1/models` — the one model served (its id is `--model-name`, default MODEL)
- `POST /v1/chat/completions` — `messages`, optional `temperature`, `max_tokens`, `top_p`, `stop`; `n` must
  be 1 and streaming is not offered. Generation stops at the agent closing tags (`</action>`, ...), which stay
  in the text; a client `stop` string cuts the text before it, as OpenAI does.
- `GET /health`

The server binds 127.0.0.1 unless told otherwise (`--host 0.0.0.0` exposes the model to the network).
Requests are answered one at a time (the model is not thread-safe); `--port 0` picks a free port. The first
stdout line is `serving MODEL on http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from flask import Flask, jsonify, request

from agentgym_opsd.policies import PolicyRequest
from agentgym_opsd.serving import serve_until_interrupted

__all__ = ["create_app", "main", "validate_chat_request"]


class BadRequest(ValueError):
    """A request body that is not a valid chat-completions request; answered with HTTP 400."""


def validate_chat_request(body: Any) -> dict[str, Any]:
    """Check a chat-completions body; returns the normalised fields or raises BadRequest saying why."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of {role, content}")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{i}] must be an object with string 'role' and 'content'")
        clean.append({"role": m["role"], "content": m["content"]})
    out: dict[str, Any] = {"messages": clean}
    temperature = body.get("temperature")
    if temperature is not None:
        if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or temperature < 0:
            raise BadRequest("'temperature' must be a number >= 0")
        out["temperature"] = float(temperature)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest("'max_tokens' must be an integer >= 1")
        out["max_tokens"] = max_tokens
    top_p = body.get("top_p")
    if top_p is not None:
        if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
            raise BadRequest("'top_p' must be a number in (0, 1]")
        out["top_p"] = float(top_p)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    out["stop"] = stop or []
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    if body.get("stream"):
        raise BadRequest("streaming is not supported")
    return out


def _cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    cuts = [i for s in stops if (i := text.find(s)) >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def create_app(policy: Any, model_name: str) -> Flask:
    """A Flask app serving `policy` (an HFPolicy: `act`, `set_temperature`, `max_new_tokens`, `top_p`)."""
    app = Flask("agentgym_opsd.serve_policy")
    lock = threading.Lock()  # one generation at a time: the model and its RNG are shared state

    def error(status: int, message: str, kind: str = "invalid_request_error") -> Any:
        return jsonify({"error": {"message": message, "type": kind}}), status

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "model": model_name})

    @app.get("/v1/models")
    def models() -> Any:
        return jsonify({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                    "owned_by": "agentgym-opsd"}]})

    @app.post("/v1/chat/completions")
    def chat_completions() -> Any:
        try:
            req = validate_chat_request(request.get_json(silent=True))
        except BadRequest as exc:
            return error(400, str(exc))
        with lock:
            saved = (policy.temperature, policy.max_new_tokens, policy.top_p)
            try:
                policy.set_temperature(req.get("temperature", saved[0]))
                policy.max_new_tokens = req.get("max_tokens", saved[1])
                policy.top_p = req.get("top_p", saved[2])
                (out,) = policy.act([PolicyRequest(req["messages"])])
                prompt_tokens = len(policy.prompt_ids(req["messages"])) if hasattr(policy, "prompt_ids") else 0
            finally:
                policy.set_temperature(saved[0])
                policy.max_new_tokens, policy.top_p = saved[1], saved[2]
        text, stopped = _cut_at_stop(out.text, req["stop"])
        hit_length = not stopped and len(out.token_ids) >= req.get("max_tokens", saved[1])
        return jsonify({
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "length" if hit_length else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(out.token_ids),
                      "total_tokens": prompt_tokens + len(out.token_ids)},
        })

    return app


def _build_policy(model: str, args: argparse.Namespace) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model

    lm, tokenizer = load_policy_model(model, dtype=args.dtype, trainable=False)
    return HFPolicy(lm, tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.serve_policy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="embedded:smollm2-135m-instruct | tiny-random | folder | checkpoint (hf: optional)")
    p.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    p.add_argument("--model-name", default=None, help="model id reported and expected (default: MODEL)")
    p.add_argument("--temperature", type=float, default=0.4, help="default temperature when a request gives none")
    p.add_argument("--max-new-tokens", type=int, default=256, help="default response limit")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = p.parse_args(argv)
    model = args.model.removeprefix("hf:")
    policy = _build_policy(model, args)
    app = create_app(policy, args.model_name or model)
    serve_until_interrupted(app, args.host, args.port, lambda url: f"serving {model} on {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
