"""OpenEnv's `EnvClient` for a `serve-openenv` server, with our typed action, observation and state.

    from agentgym_opsd.integrations.openenv_client import AgentGymEnvClient
    from agentgym_opsd.integrations.openenv_env import AgentAction

    with AgentGymEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        result = env.reset(seed=0)                              # StepResult[AgentObservation]
        result = env.step(AgentAction(text="<action>look</action>"))
        result.observation.won, result.reward, result.done

It is OpenEnv's own client (a WebSocket session per client; `.sync()` is its blocking wrapper): only the
three conversions between our types and the wire format are ours. OpenEnv's `GenericEnvClient` plays the same
server with plain dictionaries.
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from agentgym_opsd.integrations.openenv_env import AgentAction, AgentObservation, AgentState

__all__ = ["AgentGymEnvClient"]


class AgentGymEnvClient(EnvClient[AgentAction, AgentObservation, AgentState]):
    """A session on a `serve-openenv` server (`base_url` http:// or ws://)."""

    def _step_payload(self, action: AgentAction) -> dict[str, Any]:
        return {"text": action.text}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[AgentObservation]:
        # OpenEnv's wire format lifts reward and done out of the observation; put them back.
        observation = AgentObservation.model_validate(
            {**payload.get("observation", {}), "reward": payload.get("reward"), "done": payload.get("done", False)})
        return StepResult(observation=observation, reward=observation.reward, done=observation.done)

    def _parse_state(self, payload: dict[str, Any]) -> AgentState:
        return AgentState.model_validate(payload)
