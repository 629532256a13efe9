"""Our environments as OpenEnv environments (`openenv-core` 0.3): `AgentGymEnvironment`, one per session, over
one registered environment (`Env-v0` or `Env-v0:split`), with typed action, observation and state.

The action (`AgentAction.text`) is the agent's reply as written, parsed with the environment's own parser as our
rollout does: a reply without a usable action is an invalid action, never an error; the reward carries the
profile's penalty where `SessionSettings.penalize` says, and the episode goes on. Each turn is judged by the
core's one per-turn rule (`agentgym_opsd.turns`), so an episode played here is the one our rollout would record.
`AgentObservation` carries the text and our info (task, admissible actions, validity and why not, won / score,
terminated / truncated apart, the oracle distance where reported) and `prompt`, the chat our own policies would
see next. Privileged fields stay empty unless the server opts in (`SessionSettings`): the skill context `c+` and
the expert's next action. Other info keys (a WebShop goal's ASIN, privileged hints) are never sent.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field, field_validator

from agentgym_opsd import core
from agentgym_opsd.parsers import make_parser
from agentgym_opsd.prompts import HistoryItem
from agentgym_opsd.records import ChatMessage
from agentgym_opsd.registry import env_profile, load_skill_library, make, parse_env_spec, prompt_renderer_for
from agentgym_opsd.turns import check_penalize, history_item, is_penalised, record_turn

__all__ = ["MAX_ID_CHARS", "MAX_REPLY_CHARS", "RESET_FIELDS", "AgentAction", "AgentGymEnvironment", "AgentObservation", "AgentState",
           "BadRequest", "SessionSettings"]

MAX_REPLY_CHARS = 100_000
"""The longest reply accepted (422 beyond): far more than any model turn, far less than a body limit's worth."""
RESET_FIELDS = ("seed", "episode_id", "task_index", "task_id")
"""What a reset may carry: OpenEnv's seed and episode id, and our task choice (`reset(options=...)`)."""
MAX_ID_CHARS = 255
"""The longest episode or task id a reset may carry (OpenEnv's own bound on episode ids)."""
_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone UTF-16 surrogate: text with one cannot be encoded, so ids holding one are refused and replies mended."""


class BadRequest(ValueError):
    """A reset or step this session cannot play (an unknown field, a task that does not exist, a step before
    any reset): 400 over HTTP, an error message over the WebSocket; the session stays usable."""


class AgentAction(Action):
    """One agent turn: the reply as the model wrote it."""

    text: str = Field(max_length=MAX_REPLY_CHARS,
                      description="the agent's reply, parsed with the environment's action parser "
                                  "(e.g. '<action>go to desk 1</action>' for ALFWorld)")

    @field_validator("text", mode="before")
    @classmethod
    def _as_text(cls, text: Any) -> Any:
        # JSON can carry a lone UTF-16 surrogate (a \ud800 escape): not text, and no answer echoing it (an
        # observation, a validation error) could be encoded, which would end the session. A model wrote it, so
        # it becomes U+FFFD and the reply an invalid action like any other garbage. (Over plain HTTP our body
        # check refuses such JSON with 400 before it gets here.)
        return _SURROGATE.sub("\ufffd", text) if isinstance(text, str) else text


class AgentObservation(Observation):
    """The environment's answer and our info. `reward` (OpenEnv's field) is the environment's reward minus the
    profile's invalid-action penalty on an invalid turn; None after a reset."""

    text: str = Field(default="", description="the environment's observation text")
    task_id: str = ""
    task_type: str = ""
    task_text: str = ""
    admissible_actions: list[str] | None = Field(
        default=None, description="what the environment accepts now; None when it cannot enumerate them")
    action: str = Field(default="", description="the action parsed from the reply and played ('' if none)")
    action_valid: bool = True
    invalid_reason: str | None = None
    won: bool = False
    score: float = Field(default=0.0, description="partial credit in [0, 1]")
    terminated: bool = False
    truncated: bool = Field(default=False, description="the turn limit ended the episode")
    turn: int = Field(default=0, description="turns played in this episode")
    max_turns: int = 0
    oracle_distance: int | None = Field(
        default=None, description="the expert's actions still needed, where the environment reports it")
    env_reward: float | None = Field(
        default=None, description="the environment's own reward for the turn, before any penalty (None after a reset)")
    oracle_action: str | None = Field(default=None, description="the expert's next action (server opt-in)")
    skill_context: str | None = Field(default=None, description="the task's skill context c+ (server opt-in)")
    prompt: list[dict[str, str]] = Field(default_factory=list,
                                         description="the chat messages our own policies see for the next turn")


class AgentState(State):
    """The session's episode: OpenEnv's episode id and step count, and our outcome so far."""

    env_id: str = ""
    split: str | None = None
    task_id: str = ""
    won: bool = False
    score: float = 0.0
    total_reward: float = Field(default=0.0, description="the sum of the observations' rewards (penalties included)")
    num_invalid_actions: int = 0
    done: bool = False


@dataclass(frozen=True)
class SessionSettings:
    """What every session of one server plays, and which privileged fields it sends."""

    env_spec: str
    """A registered environment, optionally with a split: `ALFWorld-v0:easy`."""
    max_turns: int = 0
    """Turn limit of an episode (0 = the environment profile's)."""
    skill_context: bool = False
    """Send the task's skill context c+ (`skill_context`): privileged, for a self-teacher."""
    oracle: bool = False
    """Send the expert's next action (`oracle_action`): privileged, for demonstrations and tests."""
    penalize: str = "any"
    """Which invalid turns cost the profile's penalty (`PENALISED_KINDS`, as `algorithm.penalize`)."""
    seed: int | None = None
    """The seed of a session's first reset when it names neither a seed nor a task (OpenEnv's web playground
    resets so); later such resets go on with that generator, as Gymnasium's do. None: an unseeded task."""

    def __post_init__(self) -> None:
        check_penalize(self.penalize, "SessionSettings.penalize")
        if self.max_turns < 0:
            raise ValueError(f"SessionSettings.max_turns must be >= 0 (0 = the profile's), got {self.max_turns}")
        if self.seed is not None and not _is_int(self.seed, minimum=0):
            raise ValueError(f"SessionSettings.seed must be an integer >= 0 or None, got {self.seed!r}")


class AgentGymEnvironment(Environment[AgentAction, AgentObservation, AgentState]):
    """One session: one environment instance, its episode and the prompt history our renderer needs."""

    # Each session owns its environment instance; what instances share (generated games, a shop, an index)
    # is read-only, so sessions may run at once (OpenEnv refuses max_concurrent_envs > 1 otherwise).
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, settings: SessionSettings) -> None:
        super().__init__()
        self.settings = settings
        self.env_id, self.split = parse_env_spec(settings.env_spec)
        self.profile = env_profile(self.env_id)
        self.parser = make_parser(self.profile.parser)
        self.renderer = prompt_renderer_for(settings.env_spec)
        self.skills = load_skill_library(self.profile.skill_library) \
            if settings.skill_context and self.profile.skill_library else None
        # Made on the first reset: OpenEnv builds an instance for every GET /metadata, /state and each stateless
        # POST, and a WebShop shop takes most of a second to build.
        self._env: gym.Env | None = None
        self._state = AgentState(env_id=self.env_id, split=self.split)
        self._history: list[HistoryItem] = []
        self._observation = ""
        # What the last observation showed: the next turn's prompt, choices and the oracle's distance before it.
        self._prompt: list[ChatMessage] = []
        self._admissible: list[str] | None = None
        self._distance: int | None = None
        self._task_text = ""
        self._skill_context = ""

    # ---- OpenEnv's Environment ------------------------------------------------------------------------------

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AgentObservation:
        """Start an episode: `seed` chooses the task as `reset(seed=...)` does; `task_index` or `task_id`
        choose it directly."""
        unknown = sorted(set(kwargs) - set(RESET_FIELDS))
        if unknown:
            raise BadRequest(f"unknown reset fields {unknown}; a reset takes {', '.join(RESET_FIELDS)}")
        if seed is not None and not _is_int(seed, minimum=0):
            raise BadRequest(f"seed must be an integer >= 0, got {seed!r}")
        _check_id("episode_id", episode_id)
        first_reset = self._env is None
        env = self._environment()
        options = self._task_options(env, kwargs)
        if seed is None and not options and first_reset:
            seed = self.settings.seed
        try:
            text, info = env.reset(seed=seed, options=options)
        except (ValueError, KeyError) as exc:
            if "task_id" not in options:  # only an unknown task id is the client's error; anything else is a bug
                raise
            raise BadRequest(f"task_id {options['task_id']!r}: {exc}") from exc
        self._state = AgentState(episode_id=episode_id or str(uuid.uuid4()), env_id=self.env_id, split=self.split,
                                 task_id=str(info.get(core.TASK_ID, "")), won=bool(info.get(core.WON, False)),
                                 score=float(info.get(core.SCORE, 0.0)))
        self._history = []
        self._observation = text
        self._task_text = str(info.get(core.TASK_TEXT, ""))
        self._skill_context = self.skills.context_for(task_type=str(info.get(core.TASK_TYPE, "")),
                                                      text=self._task_text) if self.skills else ""
        return self._observe(text, info, reward=None, action="", valid=True, reason=None, terminated=False,
                             truncated=False)

    def step(self, action: AgentAction, timeout_s: float | None = None, **kwargs: Any) -> AgentObservation:
        """Play one reply. `timeout_s` (OpenEnv's optional step timeout) is accepted and unused: our steps are
        bounded by the environments themselves."""
        unknown = sorted(set(kwargs) - {"request_id"})  # OpenEnv's optional tracking id, unused
        if unknown:
            raise BadRequest(f"unknown step fields {unknown}; a step takes action, timeout_s and request_id")
        if self._env is None or self._state.episode_id is None:
            raise BadRequest("no episode in this session: reset first (over plain HTTP every request gets a fresh "
                             "session; play episodes over the WebSocket /ws, as OpenEnv's EnvClient does)")
        parsed = self.parser.parse(action.text)
        text, env_reward, terminated, truncated, info = self._env.step(parsed.action)
        if self._state.done:  # the environment answers a step after the end; it is no turn and costs nothing
            return self._observe(text, info, reward=0.0, action=parsed.action, valid=False,
                                 reason="the episode has ended", terminated=terminated, truncated=truncated)
        # The per-turn rule our rollout records by; the penalty is charged as the trainer charges it.
        turn = record_turn(index=self._state.step_count, prompt=self._prompt, text=action.text, parsed=parsed,
                           observation=text, reward=float(env_reward), info=info,
                           admissible_actions=self._admissible, distance_before=self._distance)
        valid, reason = turn.action_valid, turn.invalid_reason
        penalised = is_penalised(turn, self.settings.penalize)
        reward = turn.reward - (self.profile.invalid_action_penalty if penalised else 0.0)
        self._history.append(history_item(turn, self._observation))
        self._observation = text
        state = self._state
        state.step_count += 1
        state.total_reward += reward
        state.num_invalid_actions += not valid
        state.won, state.score = bool(info.get(core.WON, state.won)), float(info.get(core.SCORE, state.score))
        state.done = terminated or truncated
        return self._observe(text, info, reward=reward, action=parsed.action, valid=valid, reason=reason,
                             terminated=terminated, truncated=truncated, env_reward=turn.reward)

    @property
    def state(self) -> AgentState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from agentgym_opsd import __version__

        split = f" (split {self.split})" if self.split else ""
        return EnvironmentMetadata(name=f"{self.env_id}{split}", version=__version__,
                                   description=self.profile.description or f"agentgym-opsd {self.env_id}")

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    # ---- helpers ----------------------------------------------------------------------------------------------

    def _environment(self) -> gym.Env:
        if self._env is None:
            kwargs = {"max_turns": self.settings.max_turns} if self.settings.max_turns else {}
            self._env = make(self.settings.env_spec, **kwargs)
        return self._env

    @staticmethod
    def _task_options(env: gym.Env, fields: dict[str, Any]) -> dict[str, Any]:
        """The reset options of a task chosen by index or id, checked before the environment sees them."""
        options: dict[str, Any] = {}
        if fields.get("task_index") is not None:
            num_tasks = _text_env(env).num_tasks
            if not _is_int(fields["task_index"], minimum=0) or fields["task_index"] >= num_tasks:
                raise BadRequest(f"task_index must be an integer in [0, {num_tasks}), got {fields['task_index']!r}")
            options["task_index"] = fields["task_index"]
        if fields.get("task_id") is not None:
            _check_id("task_id", fields["task_id"])
            options["task_id"] = fields["task_id"]
        if len(options) > 1:
            raise BadRequest("give task_index or task_id, not both")
        return options

    def _observe(self, text: str, info: dict[str, Any], *, reward: float | None, action: str, valid: bool,
                 reason: str | None, terminated: bool, truncated: bool,
                 env_reward: float | None = None) -> AgentObservation:
        admissible = info.get(core.ADMISSIBLE_ACTIONS)
        admissible = [str(a) for a in admissible] if admissible is not None else None
        done = self._state.done
        prompt: list[ChatMessage] = self.renderer.render(
            task_text=self._task_text, observation=text, history=self._history, admissible_actions=admissible,
            turn_index=len(self._history))
        distance = info.get(core.ORACLE_DISTANCE)
        self._prompt, self._admissible, self._distance = prompt, admissible, distance
        return AgentObservation(
            text=text, task_id=self._state.task_id, task_type=str(info.get(core.TASK_TYPE, "")),
            task_text=self._task_text, admissible_actions=admissible, action=action, action_valid=valid,
            invalid_reason=reason, won=self._state.won, score=self._state.score, terminated=terminated,
            truncated=truncated, turn=self._state.step_count, max_turns=int(info.get(core.MAX_TURNS, 0)),
            oracle_distance=None if distance is None else int(distance), env_reward=env_reward,
            oracle_action=self._oracle_action() if self.settings.oracle and not done else None,
            skill_context=self._skill_context if self.settings.skill_context else None,
            prompt=prompt, done=done, reward=reward)

    def _oracle_action(self) -> str | None:
        assert self._env is not None
        try:
            return _text_env(self._env).oracle_action()
        except core.EpisodeEndedError:
            return None


def _text_env(env: gym.Env) -> core.TextEnv:
    """The `TextEnv` under the wrappers (every registered environment is one: the conformance suite checks)."""
    inner = env.unwrapped
    if not isinstance(inner, core.TextEnv):
        raise TypeError(f"{type(inner).__qualname__} is not an agentgym_opsd.core.TextEnv")
    return inner


def _check_id(name: str, value: Any) -> None:
    """An id from a request is text of at most MAX_ID_CHARS characters (it is echoed in answers and errors)."""
    if value is None:
        return
    if not isinstance(value, str) or len(value) > MAX_ID_CHARS or _SURROGATE.search(value):
        raise BadRequest(f"{name} must be text of at most {MAX_ID_CHARS} characters")


def _is_int(value: Any, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
