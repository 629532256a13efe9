"""`python -m agentgym_opsd.models.policy_server MODEL --port P`: a local HF model behind an OpenAI-compatible
API (also `agentgym-opsd serve-policy MODEL --port P`).

    python -m agentgym_opsd.models.policy_server embedded:smollm2-135m-instruct --port 8000
    python -m agentgym_opsd.evaluate --policy openai:http://127.0.0.1:8000 --env ALFWorld-v0:valid_unseen --out runs/x

MODEL is anything `load_policy_model` accepts (`embedded:smollm2-135m-instruct`, `tiny-random`, a local
folder, a LoRA adapter, a trainer checkpoint); an `hf:` prefix is allowed. Endpoints:

- `GET /v1/models` — the one model served (its id is `--model-name`, default MODEL)
- `POST /v1/chat/completions` — `messages`, optional `model` (the served id; another is answered 404 naming
  it, as OpenAI answers an unknown model; absent is fine), `temperature`, `max_tokens`, `top_p`, `stop`; `n`
  must be 1 and streaming is not offered. Generation stops at the agent closing tags (`</action>`, ...), which stay
  in the text; a client `stop` string cuts the text before it, as OpenAI does.
- `GET /health` — also says how many requests are queued

Concurrent requests are batched: a scheduler thread generates for up to `--max-batch` queued requests with
the same temperature/top_p at once (`agentgym_opsd.models.policy_batcher` explains how, and why each answer
is exactly what it would be alone). Requests whose prompt plus max_tokens is at most `--short-lane-tokens`
(1024) tokens have a scheduler thread of their own beside it, so a short request never waits for long
prompts being generated (0 = one lane for all). Prompts are checked and tokenised in the
request's own thread before they are queued, so the scheduler only ever sees token ids of prompts that fit.
Limits, each answered with a JSON error:

- `max_tokens` over `--max-tokens-cap` -> 400 (refused, not clamped: a client asking for more than it can
  get should hear so, as OpenAI refuses a request whose prompt plus max_tokens exceed the context);
  the prompt plus `max_tokens` over the model's context -> 400; a prompt over `--max-prompt-tokens` -> 400.
  Without `max_tokens` the budget is `--max-new-tokens`, shrunk to what the context has left.
- A prompt with more characters than its token limit can hold (`--max-prompt-tokens`, or the context when
  smaller, times `--prompt-chars-per-token`, 16 by default; each message counts 4 tokens' worth more for
  its template) -> 400 before it is tokenised, so a huge prompt costs no tokenising time.
- It runs on the serving kit's HTTP host (`agentgym_opsd.serving.host`, uvicorn; flags `--workers`,
  `--header-timeout`, `--body-timeout`, ...): a client that sends nothing or trickles its request holds no worker
  and gets a JSON 408 after its deadline; a declared body over `--max-body-bytes` gets 413 at once;
  SIGINT/SIGTERM lets requests in progress end for `--shutdown-grace` while new requests get 503.
- `--max-queue` requests already waiting -> 503 with Retry-After; a request that waited more than
  `--queue-timeout` seconds without being scheduled -> 503. The `openai:` client retries both.
- A client that disconnects while its request is queued: the request leaves the queue and is never
  generated (checked every 0.1 s and once more when a batch is formed). A batch whose generation has
  started runs to its end even if its clients leave; `--max-tokens-cap` bounds how long that can be.
- Bodies over `--max-body-bytes` -> 413; malformed JSON, NaN/Infinity, nesting deeper than 32 levels, lone
  surrogates, out-of-range sampling settings -> 400. Any unexpected failure is a JSON 500, never an HTML page.

The server binds 127.0.0.1 unless told otherwise (`--host 0.0.0.0` exposes the model to the network);
`--port 0` picks a free port. The first stdout line is `serving MODEL on http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from agentgym_opsd.models.policy_batcher import (
    PROMPT_CHARS_PER_TOKEN,
    SHORT_LANE_TOKENS,
    Completion,
    Job,
    JobError,
    PolicyBatcher,
    QueueFull,
)
from agentgym_opsd.serving.bodies import BodyError, read_json_body
from agentgym_opsd.serving.cli import (
    add_limit_arguments,
    limits_from_args,
    non_negative_float,
    non_negative_int,
    number_type,
    port_number,
    positive_float,
    positive_int,
)
from agentgym_opsd.serving.host import HTTPLimits, client_alive_check, serve, wsgi_host

__all__ = ["MAX_TEMPERATURE", "MIN_TEMPERATURE", "ServerLimits", "UnknownModel", "check_model", "create_app", "main",
           "validate_chat_request"]

log = logging.getLogger(__name__)

# Temperature is 0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]. The floor keeps logits / T finite in
# float32 for any realistic logit (1e-300 overflows to inf and sampling from NaN probabilities fails);
# below it sampling is greedy in all but name, so 0 says it plainly. The ceiling is OpenAI's.
MIN_TEMPERATURE = 1e-3
MAX_TEMPERATURE = 2.0


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask for and how much may wait; the CLI flags of the same names set them."""

    max_tokens_cap: int = 1024
    max_prompt_tokens: int = 4096
    max_batch: int = 16
    max_queue: int = 64
    queue_timeout_s: float = 60.0
    max_body_bytes: int = 1 << 20
    batch_window_s: float = 0.02
    prompt_chars_per_token: float = PROMPT_CHARS_PER_TOKEN  # the size a prompt may have before tokenising
    short_lane_tokens: int = SHORT_LANE_TOKENS  # prompt + max_tokens up to this: the short lane (0 = one lane)


def default_http_limits(limits: ServerLimits) -> HTTPLimits:
    """The HTTP limits of a server with `limits`: a worker holds a request while it waits in the batcher's queue
    and while it is generated, so there are workers for a full queue and a full batch in each of the two lanes
    (and a few for /health); the batcher, not the host, is what refuses a request with 503."""
    return HTTPLimits(workers=limits.max_queue + 2 * limits.max_batch + 4, max_body_bytes=limits.max_body_bytes)


class BadRequest(ValueError):
    """A request body that is not a valid chat-completions request; answered with HTTP 400."""


class UnknownModel(BadRequest):
    """A request for a model this server does not serve; answered 404 with code `model_not_found`, as OpenAI's."""


def check_model(body: Any, served: str) -> None:
    """Refuse a `model` other than the served id (UnknownModel, naming both) or one that is not a string
    (BadRequest); a body without `model` asks for the served one."""
    if not isinstance(body, dict) or body.get("model") is None:
        return
    model = body["model"]
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string")
    if model != served:
        raise UnknownModel(f"The model `{model[:200]}` does not exist: this server serves `{served}` "
                           f"(GET /v1/models lists it)")


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise BadRequest(f"'{name}' must be a number")
    try:
        value = float(value)
    except OverflowError:  # an integer literal too large for a float
        value = math.inf
    if not math.isfinite(value):  # 1e999 parses to inf even though NaN/Infinity literals are refused
        raise BadRequest(f"'{name}' must be finite")
    return value


def validate_chat_request(body: Any, *, max_tokens_cap: int | None = None) -> dict[str, Any]:
    """Check a chat-completions body; returns the normalised fields or raises BadRequest saying why.
    A `max_tokens` over `max_tokens_cap` is refused (not clamped)."""
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
    temperature = _number(body, "temperature")
    if temperature is not None:
        if temperature != 0 and not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:
            raise BadRequest(f"'temperature' must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
        out["temperature"] = temperature
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest("'max_tokens' must be an integer >= 1")
        if max_tokens_cap is not None and max_tokens > max_tokens_cap:
            raise BadRequest(f"'max_tokens' is {max_tokens}; this server generates at most {max_tokens_cap} tokens")
        out["max_tokens"] = max_tokens
    top_p = _number(body, "top_p")
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise BadRequest("'top_p' must be a number in (0, 1]")
        out["top_p"] = top_p
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


def _context_tokens(policy: Any) -> int | None:
    """The model's context length when its config names one (HF: max_position_embeddings)."""
    value = getattr(getattr(getattr(policy, "model", None), "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def _error(status: int, message: str, kind: str = "invalid_request_error", code: int | str | None = None) -> Any:
    response = jsonify({"error": {"message": message, "type": kind, "code": status if code is None else code}})
    response.status_code = status
    if status == 503:
        response.headers["Retry-After"] = "1"
    return response


def _completion_body(done: Completion, model_name: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": done.text},
                     "finish_reason": done.finish_reason}],
        "usage": {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
                  "total_tokens": done.prompt_tokens + done.completion_tokens},
    }


def create_app(policy: Any, model_name: str, limits: ServerLimits | None = None, *,
               context_tokens: int | None = None) -> Flask:
    """A Flask app serving `policy` (an HFPolicy, or anything with what `policy_batcher.BatchPolicy` lists).
    The policy's temperature, top_p and max_new_tokens at this call are the defaults for requests that
    give none; from here on only the scheduler thread touches the policy (request threads tokenise on a
    copy of its tokenizer). `context_tokens` defaults to the
    model's `max_position_embeddings`. The batcher is `app.extensions["policy_batcher"]` (close it to stop
    the scheduler thread)."""
    limits = limits or ServerLimits()
    app = Flask("agentgym_opsd.models.policy_server")
    default_temperature, default_top_p = float(policy.temperature), float(policy.top_p)
    batcher = PolicyBatcher(
        policy, default_max_tokens=int(policy.max_new_tokens), max_tokens_cap=limits.max_tokens_cap,
        max_prompt_tokens=limits.max_prompt_tokens, context_tokens=context_tokens or _context_tokens(policy),
        max_batch=limits.max_batch, max_queue=limits.max_queue, queue_timeout_s=limits.queue_timeout_s,
        batch_window_s=limits.batch_window_s, prompt_chars_per_token=limits.prompt_chars_per_token,
        short_lane_tokens=limits.short_lane_tokens)
    app.extensions["policy_batcher"] = batcher

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Any:  # 404, 405, ...: JSON like every other answer
        return _error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(Exception)
    def unexpected_error(exc: Exception) -> Any:
        log.exception("unexpected error")
        return _error(500, f"internal server error ({type(exc).__name__})", "server_error")

    @app.get("/health")
    def health() -> Any:
        return jsonify({"status": "ok", "model": model_name, "queued": batcher.queued(),
                        "batches": len(batcher.batch_sizes)})

    @app.get("/v1/models")
    def models() -> Any:
        return jsonify({"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                                    "owned_by": "agentgym-opsd"}]})

    @app.post("/v1/chat/completions")
    def chat_completions() -> Any:
        try:
            body = read_json_body(request, max_bytes=limits.max_body_bytes)
            check_model(body, model_name)
            req = validate_chat_request(body, max_tokens_cap=limits.max_tokens_cap)
        except BodyError as exc:
            return _error(exc.status, str(exc))
        except UnknownModel as exc:
            return _error(404, str(exc), code="model_not_found")
        except BadRequest as exc:
            return _error(400, str(exc))
        client_alive = client_alive_check()  # None under a test client: always connected
        job = Job(req["messages"], temperature=req.get("temperature", default_temperature),
                  top_p=req.get("top_p", default_top_p), max_tokens=req.get("max_tokens"), stop=req["stop"],
                  **({"client_alive": client_alive} if client_alive is not None else {}))
        try:
            batcher.submit(job)  # checks and tokenises the prompt in this thread, then queues it
            done = batcher.wait(job)
        except QueueFull as exc:
            return _error(503, str(exc), "server_error")
        except JobError as exc:
            return _error(exc.status, exc.message, exc.kind)
        return jsonify(_completion_body(done, model_name))

    return app


def _build_policy(model: str, args: argparse.Namespace) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model

    lm, tokenizer = load_policy_model(model, dtype=args.dtype, trainable=False)
    return HFPolicy(lm, tokenizer, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    seed=args.seed, batch_size=args.max_batch)  # one batch = one generation chunk


_temperature = number_type(float, lambda v: v == 0 or MIN_TEMPERATURE <= v <= MAX_TEMPERATURE,
                           f"0 or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
"""argparse type: a temperature requests may also ask for (0, or MIN_TEMPERATURE..MAX_TEMPERATURE)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    defaults = ServerLimits()
    p = argparse.ArgumentParser(prog="python -m agentgym_opsd.models.policy_server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="embedded:smollm2-135m-instruct | tiny-random | folder | checkpoint (hf: optional)")
    p.add_argument("--port", type=port_number, default=8000, help="TCP port (0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    p.add_argument("--model-name", default=None, help="model id reported and expected (default: MODEL)")
    p.add_argument("--temperature", type=_temperature, default=0.4,
                   help="default temperature when a request gives none")
    p.add_argument("--max-new-tokens", type=positive_int, default=256,
                   help="default response limit when a request gives no max_tokens")
    p.add_argument("--max-tokens-cap", type=positive_int, default=defaults.max_tokens_cap,
                   help="largest max_tokens a request may ask for (more is refused with 400)")
    p.add_argument("--max-prompt-tokens", type=positive_int, default=defaults.max_prompt_tokens,
                   help="longest prompt accepted, in tokens (longer is refused with 400)")
    p.add_argument("--prompt-chars-per-token", type=positive_float, default=defaults.prompt_chars_per_token,
                   help="a prompt over this many characters per prompt token allowed is refused with 400 before "
                        "it is tokenised (raise it for prompts of long whitespace runs)")
    p.add_argument("--max-batch", type=positive_int, default=defaults.max_batch,
                   help="most requests generated together (1 = one at a time)")
    p.add_argument("--max-queue", type=positive_int, default=defaults.max_queue,
                   help="most requests waiting; more are refused with 503")
    p.add_argument("--queue-timeout", type=positive_float, default=defaults.queue_timeout_s,
                   help="seconds a request may wait to be scheduled before it gets 503")
    p.add_argument("--max-body-bytes", type=positive_int, default=defaults.max_body_bytes,
                   help="largest request body accepted (larger gets 413)")
    p.add_argument("--short-lane-tokens", type=non_negative_int, default=defaults.short_lane_tokens,
                   help="requests whose prompt plus max_tokens is at most this many tokens are generated in a lane "
                        "of their own, beside longer ones (0 = one lane for all)")
    p.add_argument("--batch-window-ms", type=non_negative_float, default=defaults.batch_window_s * 1000,
                   help="how long a batch may wait for as many requests as the previous batch had (0 = never)")
    add_limit_arguments(p, default_http_limits(defaults))
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | auto")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    args = p.parse_args(argv)
    if args.max_new_tokens > args.max_tokens_cap:
        p.error(f"--max-new-tokens ({args.max_new_tokens}) is over --max-tokens-cap ({args.max_tokens_cap})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)  # usage errors exit with status 2 before the model loads
    model = args.model.removeprefix("hf:")
    policy = _build_policy(model, args)
    limits = ServerLimits(max_tokens_cap=args.max_tokens_cap, max_prompt_tokens=args.max_prompt_tokens,
                          max_batch=args.max_batch, max_queue=args.max_queue, queue_timeout_s=args.queue_timeout,
                          max_body_bytes=args.max_body_bytes, batch_window_s=args.batch_window_ms / 1000,
                          prompt_chars_per_token=args.prompt_chars_per_token,
                          short_lane_tokens=args.short_lane_tokens)
    app = create_app(policy, args.model_name or model, limits)
    try:
        http = limits_from_args(args, default_http_limits(limits))
        serve(wsgi_host(app, http), args.host, args.port, lambda url: f"serving {model} on {url}")
    finally:
        app.extensions["policy_batcher"].close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
