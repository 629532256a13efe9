"""The `openai:` client against the real policy server (`agentgym_opsd.models.policy_server`) (a subprocess serving tiny-random), and
against broken endpoints (garbage bodies, hangs, refused connections)."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from agentgym_opsd.evaluation import evaluate_policy, make_policy
from agentgym_opsd.policies import PolicyRequest

MESSAGES = [{"role": "system", "content": "Answer with <action>inc</action>."}, {"role": "user", "content": "Go."}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opsd.models.policy_server", "tiny-random", "--port", str(port),
                             "--max-new-tokens", "12"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:  # readiness: poll the model list until the server answers
            if proc.poll() is not None:
                raise RuntimeError(f"the policy server exited early:\n{proc.stdout.read() if proc.stdout else ''}")
            try:
                if requests.get(url + "/v1/models", timeout=1).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the policy server did not become ready in 120 s")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_server_speaks_the_openai_protocol(server_url):
    models = requests.get(server_url + "/v1/models", timeout=5).json()
    assert models["data"][0]["id"] == "tiny-random"
    body = {"model": "tiny-random", "messages": MESSAGES, "max_tokens": 5, "temperature": 0}
    reply = requests.post(server_url + "/v1/chat/completions", json=body, timeout=30).json()
    assert reply["object"] == "chat.completion" and isinstance(reply["choices"][0]["message"]["content"], str)
    assert reply["usage"]["completion_tokens"] <= 5 and reply["usage"]["prompt_tokens"] > 0
    again = requests.post(server_url + "/v1/chat/completions", json=body, timeout=30).json()
    assert again["choices"][0]["message"]["content"] == reply["choices"][0]["message"]["content"]  # greedy
    bad = requests.post(server_url + "/v1/chat/completions", json={"messages": "hi"}, timeout=5)
    assert bad.status_code == 400 and "messages" in bad.json()["error"]["message"]


def test_openai_client_against_the_real_server(server_url, toy_env_ids):
    policy = make_policy(f"openai:{server_url}", max_new_tokens=6, temperature=1.0)  # model from /v1/models
    outputs = policy.act([PolicyRequest(MESSAGES)] * 3)
    assert len(outputs) == 3 and all(o.error is None and o.token_ids == [] for o in outputs)
    summary = evaluate_policy(policy, "ToyCounter-v0:test", episodes=2, num_envs=2, max_turns=2)
    assert summary.episodes == 2 and summary.failed_episodes == 0
    assert all(t.num_turns == 2 for t in summary.trajectories)
    policy.close()


class _BrokenHandler(http.server.BaseHTTPRequestHandler):
    mode = "garbage"

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "hang":
            time.sleep(3)
        payload = b"<html>definitely not json</html>" if self.mode == "garbage" else b'{"choices": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except BrokenPipeError:
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def broken_server() -> Iterator[tuple[str, type[_BrokenHandler]]]:
    handler = type("Handler", (_BrokenHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("mode, reason", [("garbage", "garbage"), ("empty", "garbage"), ("hang", "timed out")])
def test_broken_endpoint_episodes_fail_with_reason_and_run_goes_on(broken_server, toy_env_ids, mode, reason):
    url, handler = broken_server
    handler.mode = mode
    policy = make_policy(f"openai:{url}", model="m", timeout_s=0.5, max_retries=1)
    policy.backoff_s = 0.0
    summary = evaluate_policy(policy, "ToyCounter-v0:test", episodes=2, num_envs=2, max_retries=1)
    assert summary.episodes == 2 and summary.failed_episodes == 2 and summary.success_rate == 0.0
    assert len(summary.failure_reasons) == 1 and reason in summary.failure_reasons[0]
    assert "after 2 attempts" in summary.failure_reasons[0]
    policy.close()


def test_refused_connection_is_a_failed_episode(toy_env_ids):
    port = _free_port()  # nothing listens there
    policy = make_policy(f"openai:http://127.0.0.1:{port}", model="m", timeout_s=0.5, max_retries=0)
    summary = evaluate_policy(policy, "ToyCounter-v0:test", episodes=1, num_envs=1, max_retries=0)
    assert summary.failed_episodes == 1 and "cannot connect" in summary.failure_reasons[0]
    policy.close()
