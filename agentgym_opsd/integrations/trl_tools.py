"""TRL's `environment_factory` for our environments: the model plays an episode by calling one tool, `act`.

`AgentGymToolEnvFactory(env_spec, ...)` goes to `GRPOTrainer(environment_factory=...)` with a dataset from
`tool_task_dataset` (docs/integrations.md has the full example). TRL (1.16) calls the factory once per rollout it
runs at once, calls `reset(**row)` and appends its text to the prompt, exposes every public method other than
`reset` and `get_reward` as a tool, and calls `get_reward()` once per finished rollout: hence one tool. An episode
is an OpenEnv session, in this process or on a `serve-openenv` server (`server_url`). An argument the parser cannot
read as it stands is first put in the parser's reply form (`ActionParser.format`), so a model may write either; an
invalid action is answered and the episode goes on. At `get_reward` the episode is appended to `record_path` in our
trajectory JSONL, one `Turn` per tool call as our rollout records it (`turns.record_turn`), without token ids (TRL
keeps those); consecutive rollouts of one task on a process share a `group_id`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agentgym_opsd import core
from agentgym_opsd.integrations.openenv_env import AgentObservation, SessionSettings
from agentgym_opsd.integrations.openenv_session import Session, open_session, reset_fields
from agentgym_opsd.integrations.trl import task_of, task_prompts
from agentgym_opsd.parsers import ActionParser, make_parser
from agentgym_opsd.records import OUTCOMES, Trajectory, append_jsonl
from agentgym_opsd.registry import env_profile, parse_env_spec
from agentgym_opsd.turns import record_turn

__all__ = ["AgentGymToolEnv", "AgentGymToolEnvFactory", "observation_text", "tool_task_dataset"]


def tool_task_dataset(tasks: Any) -> Any:
    """A `datasets.Dataset` with one `task` per task (`trl.task_prompts`: a `TaskSpec` or a task index), for
    `GRPOTrainer(train_dataset=..., environment_factory=...)`: `reset` reads it, its first observation is the
    prompt (TRL starts every prompt from an empty user message when the rows have none)."""
    from datasets import Dataset

    return Dataset.from_dict({"task": task_prompts(tasks)})


def observation_text(obs: AgentObservation) -> str:
    """What the model reads after a reset or an action: the environment's text, what it accepts now, and the
    end of the episode when it came."""
    parts = [obs.text]
    if obs.admissible_actions is not None:
        parts.append("Admissible actions: " + ", ".join(obs.admissible_actions))
    if not obs.action_valid and obs.invalid_reason:
        parts.append(f"Invalid action: {obs.invalid_reason}.")
    if obs.done:
        parts.append(f"The episode has ended: {'you completed the task' if obs.won else 'the task was not completed'}.")
    return "\n\n".join(p for p in parts if p)


class AgentGymToolEnvFactory:
    """What `GRPOTrainer(environment_factory=...)` takes: calling it makes one `AgentGymToolEnv`.

    `env_spec`: `Env-v0` or `Env-v0:split`. `server_url`: play on that `serve-openenv` server (None: in this
    process). `record_path`: the JSONL every episode is appended to (None: not recorded; give each process its
    own file). `max_turns`: the turn limit (0: the profile's; a server uses its own). `use_skills`: record `c+`
    (in-process). `outcome`: what `get_reward` returns, `won` (1/0) or `score` (partial credit).
    `group_size`: cap a group at this many consecutive rollouts of one task (TRL's `num_generations`)."""

    def __init__(self, env_spec: str, *, server_url: str | None = None,
                 record_path: str | os.PathLike[str] | None = None, max_turns: int = 0, use_skills: bool = False,
                 outcome: str = "won", group_size: int | None = None) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        if group_size is not None and group_size < 1:
            raise ValueError(f"group_size must be >= 1 (TRL's num_generations) or None, got {group_size}")
        self.env_id, _ = parse_env_spec(env_spec)
        self.profile = env_profile(self.env_id)  # an unknown id fails here, not in train()
        self.settings = SessionSettings(env_spec, max_turns=max_turns, skill_context=use_skills)
        self.server_url = server_url
        self.record_path = Path(record_path) if record_path is not None else None
        self.outcome = outcome
        self.group_size = group_size
        self.parser: ActionParser = make_parser(self.profile.parser)
        self._last_task: str | None = None
        self._run = 0  # rollouts of `_last_task` in the current group
        self._next_group = -1
        self._next_traj = 0

    def __call__(self) -> AgentGymToolEnv:
        return AgentGymToolEnv(self)

    def _ids_for(self, task: str) -> tuple[int, int]:
        """(group_id, traj_id) of the next rollout of `task` (TRL resets a batch's environments in order)."""
        if task != self._last_task or (self.group_size is not None and self._run >= self.group_size):
            self._last_task, self._run, self._next_group = task, 0, self._next_group + 1
        self._run += 1
        self._next_traj += 1
        return self._next_group, self._next_traj - 1


class AgentGymToolEnv:
    """One rollout's environment for TRL: `reset(**row)`, the tool `act`, `get_reward()`. Made by
    `AgentGymToolEnvFactory`; TRL reuses an instance for later rollouts (reset again)."""

    def __init__(self, factory: AgentGymToolEnvFactory) -> None:
        self._factory = factory
        self._session: Session = open_session(factory.settings, factory.server_url)
        self._traj: Trajectory | None = None
        self._obs: AgentObservation | None = None
        self._recorded = True

    def reset(self, **row: Any) -> str:
        """Start the task named by the row's `task` (`tool_task_dataset`); returns its first observation."""
        if "task" not in row:
            raise ValueError(f"a dataset row for AgentGymToolEnv names its task in a 'task' column "
                             f"(tool_task_dataset), got columns {sorted(row)}")
        task = task_of(row["task"])
        obs = self._session.reset(**reset_fields(task))
        group_id, traj_id = self._factory._ids_for(row["task"])
        self._traj = Trajectory(env_id=self._factory.env_id, task_id=obs.task_id, task_type=obs.task_type,
                                group_id=group_id, traj_id=traj_id, seed=task.seed, task_text=obs.task_text,
                                skill_context=obs.skill_context or "", won=obs.won, score=obs.score,
                                metadata={"trl_environment_factory": True, **task.options})
        self._obs, self._recorded = obs, False
        system = obs.prompt[0]["content"] if obs.prompt and obs.prompt[0]["role"] == "system" else ""
        return "\n\n".join(p for p in (system, f"Task: {obs.task_text}", observation_text(obs)) if p)

    def act(self, action: str) -> str:
        """Take one action in the environment and see what happens.

        Args:
            action: The action to take, written as the task's instructions ask, for example one of the admissible actions listed in the last observation.

        Returns:
            What the environment shows after the action, the actions admissible now, and whether the episode has ended.
        """
        if self._traj is None or self._obs is None:
            raise RuntimeError("AgentGymToolEnv.act before reset")
        if self._obs.done:
            return "The episode has ended; no more actions are taken."
        parser = self._factory.parser
        reply = action if parser.parse(action).valid else parser.format(action)
        before = self._obs
        obs = self._session.step(reply)
        traj = self._traj
        # The per-turn rule our rollout records by: the environment's reward, and the invalid kind the trainer's
        # penalty reads (`penalize`); what the session charged is in its observation's reward.
        env_reward = float(obs.env_reward if obs.env_reward is not None else obs.reward or 0.0)
        traj.turns.append(record_turn(index=len(traj.turns), prompt=list(before.prompt), text=action,
                                      parsed=parser.parse(reply), observation=obs.text, reward=env_reward,
                                      info={core.ACTION_VALID: obs.action_valid, core.WON: obs.won,
                                            core.SCORE: obs.score}))
        traj.total_reward += env_reward
        traj.won, traj.score, traj.terminated, traj.truncated = obs.won, obs.score, obs.terminated, obs.truncated
        self._obs = obs
        return observation_text(obs)

    def get_reward(self) -> float:
        """The episode's outcome (`won` or `score`), recorded once to the factory's `record_path`."""
        if self._traj is None:
            raise RuntimeError("AgentGymToolEnv.get_reward before reset")
        if not self._recorded and self._factory.record_path is not None:
            append_jsonl([self._traj], self._factory.record_path)
        self._recorded = True
        return self._traj.outcome(self._factory.outcome)

    @property
    def trajectory(self) -> Trajectory | None:
        """The episode so far (a property, so TRL does not take it for a tool)."""
        return self._traj

