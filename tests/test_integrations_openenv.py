"""Our environments behind OpenEnv's own server (`agentgym-opsd serve-openenv`), played by OpenEnv's own client:
an oracle episode won on every registered environment, an invalid reply penalised while the episode goes on,
the same turns as our rollout records from the same replies,
the privileged fields only on opt-in, and the hardening: 4xx for hostile bodies, unknown fields, bad tasks and
ids; the cap on sessions and on POSTs in progress; a clean stop on SIGINT and SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install -e '.[integrations]')")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect as ws_connect  # noqa: E402

from agentgym_opsd.envpool import TaskSpec  # noqa: E402
from agentgym_opsd.integrations.openenv_client import AgentGymEnvClient  # noqa: E402
from agentgym_opsd.integrations.openenv_env import AgentAction, AgentGymEnvironment, SessionSettings  # noqa: E402
from agentgym_opsd.integrations.openenv_server import (  # noqa: E402
    DRAIN_QUIET_S,
    GuardedApp,
    ServerLimits,
    bind,
    build_server,
    create_app,
    main,
)
from agentgym_opsd.parsers import make_parser  # noqa: E402
from agentgym_opsd.policies import PolicyOutput, PolicyRequest  # noqa: E402
from agentgym_opsd.registry import env_profile, registered_envs  # noqa: E402
from agentgym_opsd.rollout import RolloutRunner  # noqa: E402
from agentgym_opsd.turns import is_penalised  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPLITS = {"agentgym_opsd/ALFWorld-v0": "easy"}  # the cheapest configuration of each environment
ENV_SPECS = [f"{e}:{SPLITS[e]}" if e in SPLITS else e for e in registered_envs() if "Toy" not in e]


@contextlib.contextmanager
def running(settings: SessionSettings, limits: ServerLimits | None = None) -> Iterator[str]:
    """The server of `settings` on a free loopback port, in a thread of this process; yields its URL."""
    app = create_app(settings, limits)
    sock = bind("127.0.0.1", 0)
    server = build_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()  # the socket listens already: a client connecting now waits in its queue
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def post(url: str, path: str, body: bytes, *, content_length: int | None = None) -> tuple[int, dict[str, Any]]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body) if content_length is None else content_length))
        conn.endheaders()
        with contextlib.suppress(OSError):  # the server may answer (and close) before reading it all
            conn.send(body)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


# ---- episodes through OpenEnv's client --------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ENV_SPECS)
def test_openenv_client_plays_an_oracle_episode_to_a_win(spec: str) -> None:
    parser = make_parser(env_profile(spec.partition(":")[0]).parser)
    with running(SessionSettings(spec, oracle=True)) as url, AgentGymEnvClient(base_url=url).sync() as env:
        result = env.reset(seed=0)
        first = result.observation
        assert first.task_text and first.turn == 0 and not result.done and result.reward is None
        assert first.prompt[0]["role"] == "system" and first.text in first.prompt[-1]["content"]
        assert first.skill_context is None  # privileged: not sent without the opt-in
        total = 0.0
        while not result.done:
            assert result.observation.oracle_action, "the oracle ran out before the episode ended"
            result = env.step(AgentAction(text=parser.format(result.observation.oracle_action)))
            assert result.observation.action_valid, result.observation.invalid_reason
            total += result.reward
        final = result.observation
        assert final.won and final.terminated and not final.truncated and final.oracle_action is None
        state = env.state()
        assert state.won and state.done and state.step_count == final.turn and state.num_invalid_actions == 0
        assert state.total_reward == pytest.approx(total) and state.task_id == first.task_id
        after = env.step(AgentAction(text=parser.format("look")))  # answered, never raised; no turn, no cost
        assert after.done and after.reward == 0.0 and after.observation.turn == final.turn
        assert env.state() == state


def test_an_invalid_reply_costs_the_penalty_and_the_episode_goes_on() -> None:
    penalty = env_profile("ALFWorld-v0").invalid_action_penalty
    with running(SessionSettings("ALFWorld-v0:easy", oracle=True)) as url, \
            AgentGymEnvClient(base_url=url).sync() as env:
        start = env.reset(seed=3).observation
        for reply in ("I think I should look around.", "<action></action>", "<action>fly to the moon</action>"):
            result = env.step(AgentAction(text=reply))
            assert not result.observation.action_valid and result.observation.invalid_reason
            assert result.reward == pytest.approx(-penalty) and not result.done
        result = env.step(AgentAction(text=f"<action>{start.oracle_action}</action>"))
        assert result.observation.action_valid and result.observation.turn == 4
        assert env.state().num_invalid_actions == 3
        # the history the prompt shows holds what was played, as our rollout's prompts do
        assert start.oracle_action in result.observation.prompt[-1]["content"]


class _ScriptedThenOracle:
    """Plays `replies` in order, then the expert's actions; keeps every reply it sent."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.sent = list(replies), []

    def act(self, requests: list[PolicyRequest]) -> list[PolicyOutput]:
        (req,) = requests
        reply = self.replies[len(self.sent)] if len(self.sent) < len(self.replies) else req.format_action(req.oracle())
        self.sent.append(reply)
        return [PolicyOutput(reply)]


@pytest.mark.parametrize("penalize", ["any", "format"])
def test_the_session_and_our_rollout_record_the_same_turns(penalize: str) -> None:
    """One per-turn rule (`agentgym_opsd.turns`): the same replies played through our rollout and through an
    OpenEnv session give the same turns (prompt, action, validity, reason, observation, reward), and the
    session charges the penalty the trainer would (`penalize="format"` lets a refused action go unpunished)."""
    spec = "ALFWorld-v0:easy"
    policy = _ScriptedThenOracle(["I think I should look around.", "<action></action>",
                                  "<action>fly to the moon</action>"])
    runner = RolloutRunner(spec, num_envs=1, use_skills=False)
    try:
        (traj,) = runner.run(policy, [TaskSpec(seed=3)])
    finally:
        runner.close()
    assert traj.won and traj.num_invalid_actions == 3
    penalty = env_profile("ALFWorld-v0").invalid_action_penalty
    session = AgentGymEnvironment(SessionSettings(spec, penalize=penalize))
    try:
        shown = session.reset(seed=3)
        for reply, turn in zip(policy.sent, traj.turns, strict=True):
            answer = session.step(AgentAction(text=reply))
            assert shown.prompt == turn.prompt
            assert (answer.action, answer.action_valid, answer.invalid_reason, answer.text) == \
                (turn.action, turn.action_valid, turn.invalid_reason, turn.observation)
            assert answer.reward == pytest.approx(turn.reward - penalty * is_penalised(turn, penalize))
            shown = answer
        kinds = [t.invalid_kind for t in traj.turns[:3]]
        assert kinds == ["no_tag", "no_tag", "not_admissible"]
        assert session.state.won and session.state.num_invalid_actions == traj.num_invalid_actions
        charged = 3 if penalize == "any" else 2
        assert session.state.total_reward == pytest.approx(traj.total_reward - charged * penalty)
    finally:
        session.close()


def test_skill_context_is_sent_only_when_the_server_opts_in() -> None:
    with running(SessionSettings("ALFWorld-v0:easy", skill_context=True)) as url, \
            GenericEnvClient(base_url=url).sync() as env:  # OpenEnv's dictionary client plays it too
        result = env.reset(task_index=2)
        assert result.observation["skill_context"]
        assert result.observation["oracle_action"] is None
        assert result.observation["skill_context"] not in result.observation["prompt"][0]["content"]
        result = env.step({"text": "<action>look</action>"})
        assert result.observation["turn"] == 1 and result.observation["skill_context"]


# ---- hardening --------------------------------------------------------------------------------------------------


def test_bad_input_gets_a_clear_4xx() -> None:
    limits = ServerLimits(max_body_bytes=4096)
    with running(SessionSettings("ALFWorld-v0:easy"), limits) as url:
        for body, status, words in [
            (b'{"seed": ', 400, "malformed JSON"),
            (b'{"seed": NaN}', 400, "NaN"),
            (b"[" * 100 + b"]" * 100, 400, "nested deeper"),
            (b'{"seed": 0, "episode_id": "\\ud800"}', 400, "surrogate"),
            (b'{"seed": 0, "difficulty": "hard"}', 400, "unknown reset fields ['difficulty']"),
            (b'{"task_index": 100000}', 400, "task_index must be an integer in [0,"),
            (b'{"task_index": true}', 400, "task_index must be an integer"),
            (b'{"seed": 0, "task_id": "no-such-game"}', 400, "no-such-game"),
            (b'{"seed": "zero"}', 422, ""),
        ]:
            code, answer = post(url, "/reset", body)
            assert code == status and words in json.dumps(answer), (body, code, answer)
        code, answer = post(url, "/reset", b" " * 5000)
        assert code == 413 and "at most 4096" in answer["error"]
        code, answer = post(url, "/reset", b"{}", content_length=10**9)  # refused on the declared length
        assert code == 413
        code, answer = post(url, "/step", b'{"action": {"text": "<action>look</action>", "mood": "calm"}}')
        assert code == 422 and "mood" in json.dumps(answer)
        code, answer = post(url, "/step", b'{"action": {"text": "<action>look</action>"}, "verbose": true}')
        assert code == 400 and "unknown step fields ['verbose']" in answer["error"]
        code, answer = post(url, "/step", b'{"action": {"text": "<action>look</action>"}}')
        assert code == 400 and "reset first" in answer["error"]  # plain HTTP has no episode to step
        code, answer = post(url, "/reset", b'{"seed": 5}')
        assert code == 200 and answer["observation"]["task_text"] and answer["done"] is False

        with AgentGymEnvClient(base_url=url).sync() as env:  # over the WebSocket: an error, the session lives on
            with pytest.raises(RuntimeError, match="unknown reset fields"):
                env.reset(seed=0, difficulty="hard")
            with pytest.raises(RuntimeError, match="reset first"):
                env.step(AgentAction(text="<action>look</action>"))
            assert env.reset(seed=0).observation.turn == 0
        with GenericEnvClient(base_url=url).sync() as raw:
            raw.reset(seed=0)
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                raw.step({"text": "<action>look</action>", "mood": "calm"})
            with pytest.raises(RuntimeError, match="lone UTF-16 surrogate"):  # refused as over HTTP, not played
                raw.step({"text": "<action>\ud800</action>"})
            with pytest.raises(RuntimeError, match="lone UTF-16 surrogate"):
                raw.reset(task_id="\ud800")
            assert raw.step({"text": "<action>look</action>"}).observation["turn"] == 1
        with AgentGymEnvClient(base_url=url).sync() as env, pytest.raises(Exception):  # noqa: B017 - closed 1009
            env.step(AgentAction(text="x" * 5000))


def test_the_session_cap_refuses_one_more_and_frees_a_slot_when_one_ends() -> None:
    with running(SessionSettings("ALFWorld-v0:easy"), ServerLimits(max_sessions=2)) as url:
        first, second = AgentGymEnvClient(base_url=url).sync(), AgentGymEnvClient(base_url=url).sync()
        with first, second:
            first.reset(seed=0)
            second.reset(seed=1)
            # One more is told why at once and closed (read raw: OpenEnv's client may see the close first).
            with ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=30) as third:
                refusal = json.loads(third.recv(timeout=30))
            assert refusal["type"] == "error" and refusal["data"]["code"] == "CAPACITY_REACHED"
            assert refusal["data"]["max_sessions"] == 2
            assert first.step(AgentAction(text="<action>look</action>")).observation.turn == 1  # untouched
        # The two sessions end as their clients close; the server frees their slots once it has seen the close.
        deadline = time.monotonic() + 20
        while True:
            try:
                with AgentGymEnvClient(base_url=url).sync() as again:
                    assert again.reset(seed=2).observation.turn == 0
                break
            except (RuntimeError, ConnectionClosed) as exc:
                assert time.monotonic() < deadline, exc


def test_posts_beyond_the_cap_get_503_while_others_are_in_progress() -> None:
    """Our guard in front of OpenEnv's app, driven as ASGI: a POST held in progress, one more refused."""
    release = asyncio.Event()

    async def slow_app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    guard = GuardedApp(slow_app, ServerLimits(max_sessions=1, max_connections=4))
    scope = {"type": "http", "method": "POST", "path": "/reset", "headers": [(b"content-length", b"2")]}

    async def call() -> list[dict]:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        await guard(scope, receive, send)
        return sent

    async def scenario() -> tuple[list[dict], list[dict]]:
        held = asyncio.create_task(call())
        while guard.guarded_in_progress == 0:
            await asyncio.sleep(0)  # let the first request enter
        refused = await call()
        release.set()
        return await held, refused

    held, refused = asyncio.run(scenario())
    assert held[0]["status"] == 200 and refused[0]["status"] == 503
    assert (b"retry-after", b"1") in refused[0]["headers"] and b"max_sessions" in refused[1]["body"]
    assert guard.guarded_in_progress == 0


def test_a_stopping_guard_refuses_newcomers_and_says_when_it_has_drained() -> None:
    """The drain, driven as ASGI and with the clock given: after `begin_stop` every request gets a JSON 503 with
    Retry-After and a new WebSocket session the SERVER_STOPPING error; the listening socket may close once no
    request has been in progress for DRAIN_QUIET_S, or when the shutdown grace is spent."""
    async def app(scope: dict, receive: Any, send: Any) -> None:
        raise AssertionError("a stopping server passes nothing on")

    guard = GuardedApp(app, ServerLimits(shutdown_grace_s=5.0))
    assert not guard.drained()
    guard.begin_stop()
    start = guard.stopping_since
    assert start is not None

    def call(scope: dict, incoming: list[dict]) -> list[dict]:
        sent: list[dict] = []

        async def receive() -> dict:
            return incoming.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        asyncio.run(guard(scope, receive, send))
        return sent

    for method in ("GET", "POST"):
        sent = call({"type": "http", "method": method, "path": "/health", "headers": []}, [])
        assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
        assert json.loads(sent[1]["body"])["limit"] == "shutdown"
    sent = call({"type": "websocket", "path": "/ws"}, [{"type": "websocket.connect"}])
    assert json.loads(sent[1]["text"])["data"]["code"] == "SERVER_STOPPING"
    assert sent[2] == {"type": "websocket.close", "code": 1012}

    last = guard.last_request_s
    assert not guard.drained(last + DRAIN_QUIET_S / 2) and guard.drained(last + DRAIN_QUIET_S + 1e-6)
    guard.requests_in_progress = 1  # a request still in progress holds the socket open, up to the grace
    assert not guard.drained(last + 1.0) and guard.drained(start + 5.0 + 1e-6)


def test_sigterm_drains_the_server_before_it_stops_listening() -> None:
    """The real server process: with a POST in progress at SIGTERM, a newcomer gets the drain's JSON 503 (not a
    reset: the listening socket stays open), the POST in progress is answered, and then the server exits 0 and
    refuses connections."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opsd", "serve-openenv", "ALFWorld-v0:easy", "--port", "0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ")[1].split()[0]
        host, port = url.removeprefix("http://").split(":")
        assert post(url, "/reset", b'{"seed": 0}')[0] == 200  # the environment is loaded
        held = socket.create_connection((host, int(port)), timeout=30)
        held.sendall(b"POST /reset HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 11\r\n\r\n{\"seed\"")  # the body's rest comes after the signal
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        status, body = post(url, "/reset", b'{"seed": 0}')
        assert status == 503 and body["limit"] == "shutdown", body
        held.sendall(b": 0}")
        answer = held.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        held.close()
        assert proc.wait(timeout=30) == 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5)
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_unknown_environment_or_split_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for spec, words in [("NoSuchEnv-v0", "unknown environment"), ("ALFWorld-v0:nosplit", "no split 'nosplit'")]:
        with pytest.raises(SystemExit) as exit_info:
            main([spec, "--port", "0"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert words in err and "ALFWorld" in err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_server_cleanly(signum: int) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agentgym_opsd", "serve-openenv", "ALFWorld-v0:easy", "--port", "0"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        assert "OpenEnv server for agentgym_opsd/ALFWorld-v0 (split easy)" in banner, proc.stderr.read()
        url = banner.split(" on ")[1].split()[0]
        client = AgentGymEnvClient(base_url=url).sync()
        client.connect()
        client.reset(seed=0)  # a session is open when the signal comes
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 0
        client.close()
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_malformed_websocket_messages_get_an_error_and_the_session_goes_on() -> None:
    """Issue 45: `[1,2]`, `null`, `5`, a binary frame, deep nesting, NaN, a lone surrogate each get an error message
    without Python internals, and the same session then plays on."""
    with running(SessionSettings("ALFWorld-v0:easy")) as url, \
            ws_connect(url.replace("http", "ws", 1) + "/ws", open_timeout=30) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=30))["type"] == "observation"
        for message in ["[1,2]", "null", "5", b"\x00\x01", "[" * 10_000 + "]" * 10_000, '{"type": "step", "x": NaN}',
                        '{"type": "step", "data": {"action": {"text": "\\ud800"}}}', '{"type": 5}']:
            ws.send(message)
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", (message, reply)
            assert "object has no attribute" not in reply["data"]["message"] and "recursion" not in reply["data"]["message"]
        ws.send(json.dumps({"type": "state"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "state"  # the session lives on


def test_a_client_at_the_session_cap_waits_and_gets_a_session(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 67 item 5: a session beyond the server's cap got a bare 1013 and no retry. Our client is told
    CAPACITY_REACHED, says so in the log, waits and connects again, and gets the slot the first one frees."""
    from agentgym_opsd.integrations.openenv_session import CAPACITY_REACHED, RemoteSession

    limits = ServerLimits(max_sessions=1, max_connections=8)
    with running(SessionSettings("ALFWorld-v0:easy"), limits) as url:
        first, second = RemoteSession(url), RemoteSession(url, capacity_wait_s=30)
        first.reset(seed=0)
        threading.Timer(1.5, first.close).start()  # frees the slot while the second one waits
        with caplog.at_level("WARNING"):
            observation = second.reset(seed=1)
        assert observation.text and not observation.done
        assert any(CAPACITY_REACHED in r.getMessage() for r in caplog.records)
        second.close()
        impatient = RemoteSession(url, capacity_wait_s=0.1)
        blocker = RemoteSession(url)
        blocker.reset(seed=2)
        with pytest.raises(RuntimeError, match=CAPACITY_REACHED):
            impatient.reset(seed=3)
        blocker.close()
        impatient.close()
