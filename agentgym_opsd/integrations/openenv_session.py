"""One OpenEnv session on one of our environments, in this process or on a `serve-openenv` server, behind the
same two calls: `reset(**fields) -> AgentObservation` and `step(reply) -> AgentObservation`.

In-process it is an `AgentGymEnvironment` itself; through a server it is OpenEnv's `EnvClient` (our
`AgentGymEnvClient`, one WebSocket session), which answers with the same observation. Either way the reply is
parsed, validated and charged by `AgentGymEnvironment.step`, so an episode played here and one played through
a server are the same episode (tests/test_integrations_openenv.py plays both).

`SessionEnv` is a server's session as one of our text environments (the gymnasium turn API), so that our rollout
plays a server's episodes unchanged (`RolloutRunner(env_fn=...)`, `AgentGymRollout(server_url=...)`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import gymnasium as gym

from agentgym_opsd import core
from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.integrations.openenv_env import (
    RESET_FIELDS,
    AgentAction,
    AgentGymEnvironment,
    AgentObservation,
    SessionSettings,
)

__all__ = ["CAPACITY_REACHED", "LocalSession", "RemoteSession", "Session", "SessionEnv", "open_session", "reset_fields"]

log = logging.getLogger(__name__)

CAPACITY_REACHED = "CAPACITY_REACHED"
"""OpenEnv's error code for a session refused at the server's cap (in the client's error text)."""
TRY_AGAIN_LATER = 1013
"""The WebSocket close code the server ends a refused session with."""


class Session(Protocol):
    def reset(self, **fields: Any) -> AgentObservation: ...

    def step(self, reply: str) -> AgentObservation: ...

    def close(self) -> None: ...


class LocalSession:
    """An `AgentGymEnvironment` in this process."""

    def __init__(self, settings: SessionSettings) -> None:
        self.environment = AgentGymEnvironment(settings)

    def reset(self, **fields: Any) -> AgentObservation:
        return self.environment.reset(**fields)

    def step(self, reply: str) -> AgentObservation:
        return self.environment.step(AgentAction(text=reply))

    def close(self) -> None:
        self.environment.close()


class RemoteSession:
    """A WebSocket session on a `serve-openenv` server at `base_url`, connected on the first reset (TRL builds
    environments it may never use, to read their tools). A server at its session cap answers CAPACITY_REACHED:
    the session then waits (0.5 s, doubling up to 8 s, logged each time) and connects again, for up to
    `capacity_wait_s` in all, before it gives up with the server's message."""

    def __init__(self, base_url: str, *, capacity_wait_s: float = 120.0) -> None:
        self.base_url = base_url
        self.capacity_wait_s = capacity_wait_s
        self._client: Any = None

    def reset(self, **fields: Any) -> AgentObservation:
        waited, delay = 0.0, 0.5
        while True:
            if self._client is None:
                from agentgym_opsd.integrations.openenv_client import AgentGymEnvClient

                self._client = AgentGymEnvClient(base_url=self.base_url).sync()
                self._client.connect()
            try:
                return self._client.reset(**fields).observation
            except Exception as exc:
                if not _at_capacity(exc):
                    raise
                if waited >= self.capacity_wait_s:
                    raise RuntimeError(f"the server at {self.base_url} held all its sessions for {waited:g} s "
                                       f"({CAPACITY_REACHED}); start it with a larger --max-sessions or play fewer "
                                       f"episodes at once") from exc
                self.close()  # the server closed this connection; a new one may find a free slot
                log.warning("the server at %s holds all its sessions (%s); retrying in %.1f s", self.base_url,
                            CAPACITY_REACHED, delay)
                time.sleep(delay)
                waited += delay
                delay = min(2 * delay, 8.0)

    def step(self, reply: str) -> AgentObservation:
        if self._client is None:
            raise RuntimeError(f"no episode in the session on {self.base_url}: reset first")
        return self._client.step(AgentAction(text=reply)).observation

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _at_capacity(exc: BaseException) -> bool:
    """Whether `exc` is the server's refusal at its session cap: OpenEnv's client raises the CAPACITY_REACHED
    error message it read, or, when the server's close (1013, "try again later") came first, websockets'
    ConnectionClosed with that code."""
    received = getattr(exc, "rcvd", None)
    return CAPACITY_REACHED in str(exc) or getattr(received, "code", None) == TRY_AGAIN_LATER


def open_session(settings: SessionSettings, server_url: str | None = None) -> Session:
    """A session playing `settings` here, or on the server at `server_url` (which was started with its own
    settings: `serve-openenv ENV --max-turns ... --skill-context`)."""
    return LocalSession(settings) if server_url is None else RemoteSession(server_url)


def reset_fields(task: TaskSpec) -> dict[str, Any]:
    """The reset request of `task`: its seed and its options (`task_index` or `task_id`)."""
    unknown = sorted(set(task.options) - set(RESET_FIELDS))
    if unknown:
        raise ValueError(f"TaskSpec.options {unknown} cannot be sent to an OpenEnv session; it takes "
                         f"{', '.join(f for f in RESET_FIELDS if f not in ('seed', 'episode_id'))}")
    return {"seed": task.seed, **task.options}


class SessionEnv(gym.Env):  # type: ignore[misc]
    """A session on the `serve-openenv` server at `server_url` (serving `env_spec`) with our environments'
    `reset(seed, options) -> (text, info)` and `step(action)`. A step's action, already parsed by the caller, is
    sent in the parser's reply form (`ActionParser.format`), which the server parses back to it; the answer's
    `info` has what our rollout records (the task, admissible actions, whether the turn was valid, won, score,
    the oracle's distance) and the reward is the environment's own (`env_reward`: our trainer charges the
    invalid-action penalty itself). Info the server never sends (a WebShop goal's id, privileged hints, the
    task's data source) is absent."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, server_url: str, env_spec: str) -> None:
        from agentgym_opsd.parsers import make_parser
        from agentgym_opsd.registry import env_profile, parse_env_spec

        self.parser = make_parser(env_profile(parse_env_spec(env_spec)[0]).parser)
        self.session = RemoteSession(server_url)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        obs = self.session.reset(**reset_fields(TaskSpec(seed, dict(options or {}))))  # type: ignore[arg-type]
        return obs.text, _info(obs)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs = self.session.step(self.parser.format(action))
        return obs.text, float(obs.env_reward or 0.0), obs.terminated, obs.truncated, _info(obs)

    def close(self) -> None:
        self.session.close()


def _info(obs: AgentObservation) -> dict[str, Any]:
    """Our `info` keys from a server's observation."""
    info: dict[str, Any] = {core.TASK_ID: obs.task_id, core.TASK_TYPE: obs.task_type, core.TASK_TEXT: obs.task_text,
                            core.ADMISSIBLE_ACTIONS: obs.admissible_actions, core.ACTION_VALID: obs.action_valid,
                            core.WON: obs.won, core.SCORE: obs.score, core.MAX_TURNS: obs.max_turns}
    if obs.oracle_distance is not None:
        info[core.ORACLE_DISTANCE] = obs.oracle_distance
    return info
