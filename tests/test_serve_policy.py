"""The policy server under load and abuse: caps on max_tokens and prompts, batching of concurrent requests
(answers reach the right clients, each cut to its own budget), the bounded queue and its timeout, clients
that disconnect while queued, oversize prompts (refused before tokenising; tokenising is never the
scheduler's work), hostile bodies and CLI usage errors.

Most tests use a recording stand-in policy (answers "echo:<last message>" one character per token) behind
the real HTTP host (`serving.host`, uvicorn); its `gate` holds a generation open so a test can queue requests behind it
deterministically instead of racing the scheduler."""

from __future__ import annotations

import copy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from agentgym_opsd.models import policy_server
from agentgym_opsd.models.policy_server import ServerLimits, create_app, default_http_limits
from agentgym_opsd.policies import PolicyOutput
from agentgym_opsd.serving import BackgroundServer, wsgi_host

TIMEOUT = 30  # generous: the machine may be busy; passing tests take well under a second each


class _CharTokenizer:
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(map(chr, ids))


class RecordingPolicy:
    """A stand-in HFPolicy: one token per character; records every batch it generates and its settings."""

    def __init__(self, max_new_tokens: int = 32, fail: bool = False, hang_over: int | None = None) -> None:
        self.tokenizer = _CharTokenizer()
        self.temperature, self.top_p, self.max_new_tokens = 0.0, 1.0, max_new_tokens
        self.batches: list[list[str]] = []
        self.settings: list[tuple[float, float, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self._fail = [fail]  # shared with the short lane's view (`with_sampling`), as `gate` and the records are
        self.tokenised: list[tuple[str, str]] = []  # (start of the last message, thread) per prompt_ids call
        self.hang_over = hang_over  # prompt_ids on a longer last message hangs the thread calling it

    @property
    def fail(self) -> bool:
        return self._fail[0]

    @fail.setter
    def fail(self, value: bool) -> None:
        self._fail[0] = value

    def set_temperature(self, temperature: float) -> None:
        self.temperature = temperature

    def with_sampling(self, *, temperature: float, seed: int) -> RecordingPolicy:
        """The short lane's view: the same records and gate, its own settings."""
        view = copy.copy(self)
        view.temperature = temperature
        return view

    def prompt_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        self.tokenised.append((messages[-1]["content"][:40], threading.current_thread().name))
        if self.hang_over is not None and len(messages[-1]["content"]) > self.hang_over:
            time.sleep(TIMEOUT)  # a tokenizer stuck on a huge prompt: whoever calls this is held
        if any(m["role"] not in ("system", "user", "assistant") for m in messages):
            raise ValueError("unknown role")
        return [ord(c) for c in messages[-1]["content"]]

    def generate_ids(self, prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]:
        self.batches.append(["".join(map(chr, p)) for p in prompts])
        self.settings.append((self.temperature, self.top_p, self.max_new_tokens))
        self.entered.set()
        assert self.gate.wait(TIMEOUT)
        if self.fail:
            raise RuntimeError("the model broke")
        outputs = []
        for p in prompts:
            full = "echo:" + "".join(map(chr, p))
            text = full[: self.max_new_tokens]
            outputs.append(PolicyOutput(text, [ord(c) for c in text], [0.0] * len(text),
                                        finish_reason="length" if len(full) > self.max_new_tokens else "stop"))
        return outputs


@contextmanager
def served(policy: Any, limits: ServerLimits | None = None, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """The server on a free port, as `main` serves it; yields (chat-completions URL, batcher)."""
    limits = limits or ServerLimits(batch_window_s=0.0)
    app = create_app(policy, "stand-in", limits, **kwargs)
    server = BackgroundServer(wsgi_host(app, default_http_limits(limits))).start()
    batcher = app.extensions["policy_batcher"]
    try:
        yield f"{server.url}/v1/chat/completions", batcher
    finally:
        policy.gate.set() if hasattr(policy, "gate") else None
        server.stop()
        batcher.close()


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "stand-in", "messages": [{"role": "user", "content": content}], **fields}


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextmanager
def held(policy: RecordingPolicy, url: str, pool: ThreadPoolExecutor) -> Iterator[Any]:
    """A first request whose generation is held open until the block ends; yields its future."""
    policy.gate.clear()
    policy.entered.clear()
    first = pool.submit(requests.post, url, json=chat("first"), timeout=TIMEOUT)
    assert policy.entered.wait(TIMEOUT)
    try:
        yield first
    finally:
        policy.gate.set()


def test_huge_max_tokens_is_refused_while_another_client_is_served():
    policy = RecordingPolicy()
    with served(policy, ServerLimits(max_tokens_cap=64, batch_window_s=0.0)) as (url, _), ThreadPoolExecutor(2) as pool:
        huge = pool.submit(requests.post, url, json=chat("greedy", max_tokens=10**9), timeout=TIMEOUT)
        other = pool.submit(requests.post, url, json=chat("modest", max_tokens=8), timeout=TIMEOUT)
        start = time.monotonic()
        refused, answered = huge.result(), other.result()
        assert time.monotonic() - start < 10
    assert refused.status_code == 400 and "at most 64" in refused.json()["error"]["message"]
    assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"] == "echo:mod"
    assert policy.batches == [["modest"]]  # the refused request never reached the model


def test_prompt_over_the_limit_or_the_context_is_refused():
    policy = RecordingPolicy(max_new_tokens=8)
    limits = ServerLimits(max_prompt_tokens=10, max_tokens_cap=64, batch_window_s=0.0)
    with served(policy, limits, context_tokens=20) as (url, _):
        long_prompt = requests.post(url, json=chat("x" * 11), timeout=TIMEOUT)
        over_context = requests.post(url, json=chat("x" * 10, max_tokens=11), timeout=TIMEOUT)
        default_budget = requests.post(url, json=chat("x" * 10), timeout=TIMEOUT)
    assert long_prompt.status_code == 400 and "at most 10" in long_prompt.json()["error"]["message"]
    assert over_context.status_code == 400 and "context is 20 tokens" in over_context.json()["error"]["message"]
    assert default_budget.status_code == 200 and default_budget.json()["usage"]["completion_tokens"] == 8


def test_concurrent_requests_are_batched_and_answers_reach_their_clients():
    policy = RecordingPolicy()
    prompts = [f"prompt-{i}" for i in range(6)]
    with served(policy) as (url, batcher), ThreadPoolExecutor(8) as pool:
        with held(policy, url, pool) as first:
            futures = {p: pool.submit(requests.post, url, json=chat(p), timeout=TIMEOUT) for p in prompts}
            wait_until(lambda: batcher.queued() == len(prompts), "the requests to queue")
        answers = {p: f.result().json()["choices"][0]["message"]["content"] for p, f in futures.items()}
        assert first.result().status_code == 200
    assert [len(b) for b in policy.batches] == [1, len(prompts)]
    assert answers == {p: f"echo:{p}" for p in prompts}


def test_each_request_gets_its_own_budget_stop_and_usage_in_a_shared_batch():
    policy = RecordingPolicy()
    with served(policy) as (url, batcher), ThreadPoolExecutor(4) as pool:
        with held(policy, url, pool):
            short = pool.submit(requests.post, url, json=chat("abcdef", max_tokens=3), timeout=TIMEOUT)
            long = pool.submit(requests.post, url, json=chat("abcdef", max_tokens=20), timeout=TIMEOUT)
            stopped = pool.submit(requests.post, url, json=chat("abcdef", max_tokens=20, stop=["b"]), timeout=TIMEOUT)
            wait_until(lambda: batcher.queued() == 3, "the requests to queue")
        short, long, stopped = (f.result().json() for f in (short, long, stopped))
    assert [len(b) for b in policy.batches] == [1, 3] and policy.settings[1][2] == 20  # the group's largest budget
    assert short["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "ech"},
                                   "finish_reason": "length"}
    assert short["usage"] == {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}
    assert long["choices"][0]["message"]["content"] == "echo:abcdef" and long["choices"][0]["finish_reason"] == "stop"
    assert long["usage"]["completion_tokens"] == 11
    assert stopped["choices"][0]["message"]["content"] == "echo:a" and stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] == 7  # through the stop string, as OpenAI counts


def test_requests_with_different_sampling_settings_are_not_mixed():
    policy = RecordingPolicy()
    with served(policy) as (url, batcher), ThreadPoolExecutor(6) as pool:
        with held(policy, url, pool):
            futures = [pool.submit(requests.post, url, json=chat(f"p{i}", temperature=t, top_p=0.9), timeout=TIMEOUT)
                       for i, t in enumerate([0.5, 1.0, 0.5, 1.0])]
            wait_until(lambda: batcher.queued() == 4, "the requests to queue")
        assert all(f.result().status_code == 200 for f in futures)
    # which settings group runs first, and the order inside a group, follow arrival; only the grouping is fixed
    assert sorted(sorted(b) for b in policy.batches[1:]) == [["p0", "p2"], ["p1", "p3"]]
    assert sorted(s[:2] for s in policy.settings[1:]) == [(0.5, 0.9), (1.0, 0.9)]


def test_a_full_queue_answers_503():
    policy = RecordingPolicy()
    with served(policy, ServerLimits(max_queue=1, batch_window_s=0.0)) as (url, batcher), ThreadPoolExecutor(4) as pool:
        with held(policy, url, pool):
            queued = pool.submit(requests.post, url, json=chat("queued"), timeout=TIMEOUT)
            wait_until(lambda: batcher.queued() == 1, "the request to queue")
            refused = requests.post(url, json=chat("one too many"), timeout=TIMEOUT)
        assert queued.result().status_code == 200
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
    assert "limit is 1" in refused.json()["error"]["message"]


def test_a_request_waiting_past_the_queue_timeout_answers_503():
    policy = RecordingPolicy()
    limits = ServerLimits(queue_timeout_s=0.3, batch_window_s=0.0)
    with served(policy, limits) as (url, _), ThreadPoolExecutor(4) as pool:
        with held(policy, url, pool):
            late = requests.post(url, json=chat("late"), timeout=TIMEOUT)
    assert late.status_code == 503 and "waited more than 0.3 s" in late.json()["error"]["message"]
    assert all("late" not in batch for batch in policy.batches)


def test_a_disconnected_clients_request_is_not_generated():
    policy = RecordingPolicy()
    with served(policy) as (url, batcher), ThreadPoolExecutor(4) as pool:
        port = int(url.split(":")[2].split("/")[0])
        with held(policy, url, pool):
            body = json.dumps(chat("ghost")).encode()
            client = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_until(lambda: batcher.queued() == 1, "the request to queue")
            client.close()
            wait_until(lambda: batcher.queued() == 0, "the server to notice the disconnect")
        after = requests.post(url, json=chat("after"), timeout=TIMEOUT)
    assert after.status_code == 200 and batcher.dropped_disconnected == 1
    assert policy.batches == [["first"], ["after"]]


def test_a_failing_generation_is_a_json_500_and_the_server_goes_on():
    policy = RecordingPolicy(fail=True)
    with served(policy) as (url, _):
        failed = requests.post(url, json=chat("boom"), timeout=TIMEOUT)
        policy.fail = False
        fine = requests.post(url, json=chat("fine"), timeout=TIMEOUT)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
    assert fine.status_code == 200


def test_an_oversize_prompt_is_refused_before_it_reaches_the_tokenizer():
    policy = RecordingPolicy()
    limits = ServerLimits(max_prompt_tokens=100, prompt_chars_per_token=4, batch_window_s=0.0)
    with served(policy, limits) as (url, batcher):
        assert batcher.max_prompt_chars == 400  # 100 tokens x 4 characters
        huge = requests.post(url, json=chat("x" * 500_000), timeout=TIMEOUT)
        many = requests.post(url, json={"messages": [{"role": "user", "content": ""}] * 100}, timeout=TIMEOUT)
        fits = requests.post(url, json=chat("y" * 300), timeout=TIMEOUT)  # 300 + 4 (role) + 16 (framing) <= 400
    for reply in (huge, many):
        assert reply.status_code == 400 and reply.headers["Content-Type"] == "application/json"
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and "too long to tokenise" in error["message"]
        assert "at most 400" in error["message"]
    assert fits.status_code == 400 and "at most 100" in fits.json()["error"]["message"]  # tokenised, then refused
    assert [content for content, _ in policy.tokenised] == ["y" * 40]  # neither oversize prompt was tokenised
    assert policy.batches == []


def test_the_character_bound_follows_the_context_when_it_is_smaller():
    policy = RecordingPolicy()
    with served(policy, ServerLimits(max_prompt_tokens=100, prompt_chars_per_token=4, batch_window_s=0.0),
                context_tokens=50) as (url, batcher):
        assert batcher.max_prompt_chars == 200
        reply = requests.post(url, json=chat("x" * 250), timeout=TIMEOUT)
    assert reply.status_code == 400 and "too long to tokenise" in reply.json()["error"]["message"]
    assert policy.tokenised == []


def test_oversize_prompts_in_flight_do_not_hold_up_a_small_request():
    """The attack: concurrent prompts of nearly a megabyte each (all refused). They are refused by size in
    their own request threads, so a tokenizer that would hang on any of them is never called, and a small
    request sent meanwhile is tokenised in its own request thread and answered; the scheduler thread never
    tokenises."""
    policy = RecordingPolicy(hang_over=10_000)
    with served(policy, ServerLimits(batch_window_s=0.0)) as (url, batcher), ThreadPoolExecutor(8) as pool:
        huge = [pool.submit(requests.post, url, json=chat("x" * 900_000), timeout=TIMEOUT) for _ in range(8)]
        small = requests.post(url, json=chat("hello"), timeout=TIMEOUT)
        refused = [f.result() for f in huge]
    assert small.status_code == 200 and small.json()["choices"][0]["message"]["content"] == "echo:hello"
    assert all(r.status_code == 400 and "too long to tokenise" in r.json()["error"]["message"] for r in refused)
    assert [content for content, _ in policy.tokenised] == ["hello"]
    assert not {thread for _, thread in policy.tokenised} & set(batcher.thread_names)
    assert policy.batches == [["hello"]]


def test_the_scheduler_thread_never_tokenises():
    policy = RecordingPolicy()
    prompts = [f"p{i}" for i in range(4)]
    with served(policy) as (url, batcher), ThreadPoolExecutor(6) as pool:
        with held(policy, url, pool):
            futures = [pool.submit(requests.post, url, json=chat(p), timeout=TIMEOUT) for p in prompts]
            wait_until(lambda: batcher.queued() == len(prompts), "the requests to queue")
        assert all(f.result().status_code == 200 for f in futures)
    assert sorted(content for content, _ in policy.tokenised) == sorted(["first", *prompts])
    assert not {thread for _, thread in policy.tokenised} & set(batcher.thread_names)


# -- hostile bodies (a test client: no concurrency involved) -------------------------------------------------

@pytest.fixture
def client() -> Iterator[Any]:
    app = create_app(RecordingPolicy(), "stand-in", ServerLimits(max_body_bytes=4096, batch_window_s=0.0))
    yield app.test_client()
    app.extensions["policy_batcher"].close()


def _body(content: str = "hi", **fields: str) -> bytes:
    extra = "".join(f', "{k}": {v}' for k, v in fields.items())
    return f'{{"messages": [{{"role": "user", "content": "{content}"}}]{extra}}}'.encode()


@pytest.mark.parametrize("raw, status, says", [
    (b"[" * 2000 + b"]" * 2000, 400, "nested deeper"),  # under the 4096-byte limit
    (b'{"a":' * 40 + b"1" + b"}" * 40, 400, "nested deeper"),
    (_body(temperature="NaN"), 400, "NaN"),
    (_body(temperature="Infinity"), 400, "Infinity"),
    (_body(temperature="1e999"), 400, "finite"),
    (_body(temperature="1e-300"), 400, "temperature"),
    (_body(temperature="2.5"), 400, "temperature"),
    (_body(temperature="true"), 400, "temperature"),
    (_body(top_p="0"), 400, "top_p"),
    (_body(top_p="-Infinity"), 400, "Infinity"),
    (_body(top_p="1.5"), 400, "top_p"),
    (_body(max_tokens="1e9"), 400, "integer"),
    (_body(max_tokens="1" + "0" * 400), 400, "at most"),
    (_body(content="\\ud800"), 400, "surrogate"),
    (_body(content="x" * 5000), 413, "at most 4096"),
    (b"\xff\xfe{}", 400, "UTF-8"),
    (b"", 400, "empty"),
    (b'{"messages": "hi"}', 400, "messages"),
    (b'{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "role"),
])
def test_hostile_bodies_get_a_json_4xx(client, raw, status, says):
    reply = client.post("/v1/chat/completions", data=raw, content_type="application/json")
    assert reply.status_code == status and reply.is_json
    assert says in reply.get_json()["error"]["message"]


def test_unknown_routes_and_unexpected_errors_are_json(client, monkeypatch):
    missing = client.get("/nowhere")
    assert missing.status_code == 404 and missing.is_json
    assert client.get("/v1/chat/completions").status_code == 405

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(policy_server, "validate_chat_request", explode)
    broken = client.post("/v1/chat/completions", data=_body(), content_type="application/json")
    assert broken.status_code == 500 and broken.is_json and "RuntimeError" in broken.get_json()["error"]["message"]


def test_validate_chat_request_keeps_its_old_calling_convention():
    out = policy_server.validate_chat_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9,
                                              "temperature": 0, "stop": "a"})
    assert out["max_tokens"] == 10**9 and out["temperature"] == 0.0 and out["stop"] == ["a"]


# -- command line -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--port", "99999"], "port must be in 0..65535"),
    (["--port", "eighty"], "not a port number"),
    (["--max-batch", "0"], "must be >= 1"),
    (["--max-queue", "-3"], "must be >= 1"),
    (["--queue-timeout", "nan"], "finite number > 0"),
    (["--max-tokens-cap", "1.5"], "not an integer"),
    (["--temperature", "1e-300"], "must be 0 or in"),
    (["--batch-window-ms", "-1"], ">= 0"),
    (["--prompt-chars-per-token", "0"], "finite number > 0"),
    (["--max-new-tokens", "300", "--max-tokens-cap", "100"], "over --max-tokens-cap"),
])
def test_cli_usage_errors_exit_2_with_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        policy_server.main(["tiny-random", *argv])  # exits before loading any model
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "error:" in err[-1] and says in err[-1] and "Traceback" not in "\n".join(err)


# -- the real model -----------------------------------------------------------------------------------------

def test_tiny_random_model_is_batched_with_per_request_budgets():
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model

    model, tokenizer = load_policy_model("tiny-random", trainable=False)
    policy = HFPolicy(model, tokenizer, max_new_tokens=8, temperature=1.0, seed=0)
    gate, entered, generate = threading.Event(), threading.Event(), policy.generate_ids

    def held_generate(prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]:
        entered.set()
        assert gate.wait(TIMEOUT)
        return generate(prompts)

    policy.generate_ids = held_generate  # type: ignore[method-assign]
    # one lane: a short lane's view would generate through this patched method on `policy`'s own settings
    with served(policy, ServerLimits(max_tokens_cap=32, batch_window_s=0.0, short_lane_tokens=0)) as (url, batcher), \
            ThreadPoolExecutor(5) as pool:
        try:
            first = pool.submit(requests.post, url, json=chat("first"), timeout=TIMEOUT)
            assert entered.wait(TIMEOUT)
            futures = [pool.submit(requests.post, url, json=chat(f"task {i}", max_tokens=2 + 3 * i), timeout=TIMEOUT)
                       for i in range(4)]
            wait_until(lambda: batcher.queued() == 4, "the requests to queue")
        finally:
            gate.set()
        replies = [f.result() for f in futures]
        assert first.result().status_code == 200
    assert batcher.batch_sizes == [1, 4]
    for i, reply in enumerate(replies):
        assert reply.status_code == 200
        usage, choice = reply.json()["usage"], reply.json()["choices"][0]
        assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 2 + 3 * i
        assert choice["finish_reason"] in ("stop", "length")
        if choice["finish_reason"] == "length":
            assert usage["completion_tokens"] == 2 + 3 * i


# -- issue 35: long prompts do not hold up a short request; an unknown model is a 404 ---------------------

_WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly grumpy kings".split()


def _long_prompt(seed: int) -> str:
    """About 3,900 tokens of the SmolLM2 tokenizer (the report's long prompts)."""
    return " ".join(_WORDS[(seed + k * 7) % len(_WORDS)] + str(k % 10) for k in range(1775))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_short_request_is_answered_while_long_prompts_are_generated(temperature: float):
    """Three ~3,900-token prompts (max_tokens 64) hold the main lane (their generation is gated open); a short
    request sent after them is answered meanwhile, by the short lane, greedy or not (one lane made it wait for
    all of them: 107.7 s on SmolLM2, or a 503 after the queue timeout). Then the long ones are answered too."""
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.models.loading import load_policy_model

    model, tokenizer = load_policy_model("tiny-random", trainable=False)
    policy = HFPolicy(model, tokenizer, max_new_tokens=16, temperature=0.0, seed=0)
    with served(policy, ServerLimits(batch_window_s=0.0)) as (url, batcher), ThreadPoolExecutor(4) as pool:
        gate, entered, generate = threading.Event(), threading.Event(), policy.generate_ids

        def held_generate(prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]:
            entered.set()
            assert gate.wait(TIMEOUT)
            return generate(prompts)

        policy.generate_ids = held_generate  # type: ignore[method-assign]  # the main lane's policy only
        try:
            def send_long(i: int) -> Any:
                return pool.submit(requests.post, url, json=chat(_long_prompt(i), max_tokens=64, temperature=0),
                                   timeout=TIMEOUT)

            # the first alone into generation, then the others: sent together, two could share its batch
            longs = [send_long(0)]
            assert entered.wait(TIMEOUT)
            longs += [send_long(i) for i in (1, 2)]
            wait_until(lambda: batcher.queued() == 2, "the other long prompts to queue behind the first")
            started = time.monotonic()
            short = requests.post(url, json=chat("Say hi.", max_tokens=16, temperature=temperature), timeout=TIMEOUT)
            short_s = time.monotonic() - started
            assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] >= 1
            assert short_s < 10 and not any(f.done() for f in longs)  # answered while the long ones wait
        finally:
            gate.set()
        assert all(f.result().status_code == 200 for f in longs)
        assert all(f.result().json()["usage"]["prompt_tokens"] > 3500 for f in longs)
        if temperature == 0:  # the short lane answers exactly what one lane would (greedy)
            policy.generate_ids = generate  # type: ignore[method-assign]
            alone = requests.post(url, json=chat("Say hi.", max_tokens=16, temperature=0), timeout=TIMEOUT)
            assert alone.json()["choices"][0]["message"] == short.json()["choices"][0]["message"]


def test_lanes_split_requests_by_prompt_plus_budget():
    """`short_lane_tokens` 40: a 5-token prompt with max_tokens 36 goes to the main lane, one with max_tokens
    30 to the short lane, which answers it while the main lane's generation is held."""
    policy = RecordingPolicy(max_new_tokens=8)
    with served(policy, ServerLimits(batch_window_s=0.0, short_lane_tokens=40, max_tokens_cap=64)) as (url, batcher), \
            ThreadPoolExecutor(1) as pool:
        assert batcher.thread_names == ["policy-batcher-short", "policy-batcher"]
        gate, entered, generate = threading.Event(), threading.Event(), policy.generate_ids

        def held_main(prompts: Sequence[Sequence[int]]) -> list[PolicyOutput]:
            entered.set()
            assert gate.wait(TIMEOUT)
            return generate(prompts)

        policy.generate_ids = held_main  # type: ignore[method-assign]  # the short lane's view keeps its own
        try:
            main = pool.submit(requests.post, url, json=chat("other", max_tokens=36), timeout=TIMEOUT)
            assert entered.wait(TIMEOUT)
            short = requests.post(url, json=chat("short", max_tokens=30), timeout=TIMEOUT)
            assert short.status_code == 200 and not main.done()
        finally:
            gate.set()
        assert main.result().status_code == 200
    assert policy.batches == [["short"], ["other"]]


@pytest.mark.parametrize("model, status", [("gpt-4", 404), ("stand-in", 200), (None, 200), (7, 400)])
def test_a_model_other_than_the_served_one_is_a_404_naming_it(client, model, status):
    body = {"messages": [{"role": "user", "content": "hi"}], **({"model": model} if model is not None else {})}
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == status and reply.is_json
    if status == 404:  # OpenAI's shape for an unknown model, with the id that is served
        error = reply.get_json()["error"]
        assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
        assert "gpt-4" in error["message"] and "`stand-in`" in error["message"]
