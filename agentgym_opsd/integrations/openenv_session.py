"""One OpenEnv session on one of our environments, in this process or on a `serve-openenv` server, behind the
same two calls: `reset(**fields) -> AgentObservation` and `step(reply) -> AgentObservation`.

In-process it is an `AgentGymEnvironment` itself; through a server it is OpenEnv's `EnvClient` (our
`AgentGymEnvClient`, one WebSocket session), which answers with the same observation. Either way the reply is
parsed, validated and charged by `AgentGymEnvironment.step`, so an episode played here and one played through
a server are the same episode (tests/test_integrations_openenv.py plays both).
"""

from __future__ import annotations

from typing import Any, Protocol

from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.integrations.openenv_env import (
    RESET_FIELDS,
    AgentAction,
    AgentGymEnvironment,
    AgentObservation,
    SessionSettings,
)

__all__ = ["LocalSession", "RemoteSession", "Session", "open_session", "reset_fields"]


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
    environments it may never use, to read their tools)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self._client: Any = None

    def reset(self, **fields: Any) -> AgentObservation:
        if self._client is None:
            from agentgym_opsd.integrations.openenv_client import AgentGymEnvClient

            self._client = AgentGymEnvClient(base_url=self.base_url).sync()
            self._client.connect()
        return self._client.reset(**fields).observation

    def step(self, reply: str) -> AgentObservation:
        if self._client is None:
            raise RuntimeError(f"no episode in the session on {self.base_url}: reset first")
        return self._client.step(AgentAction(text=reply)).observation

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


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
