"""Multi-turn rollouts: a policy plays B tasks x G copies through an EnvPool, turn by turn.

Each turn, every active environment's prompt is rendered and the whole batch goes to the policy at once
(batched generation); the answers are parsed and the environments stepped in parallel. Everything the
trainer needs later is recorded in `Trajectory`/`Turn`: the student prompt, the sampled token ids and their
log-probs, the action, its validity, the observation, the reward, and the task's skill context `c+`.
When the environment reports `info["oracle_distance"]` (the expert's distance to the goal), each turn records
it before and after its action (`Turn.info["oracle_distance_before"/"oracle_distance_after"]`), so a turn
can be labelled progress (the distance dropped) or wasted without replaying the episode.
This module knows only the turn API, never a concrete environment; where the environments run (threads,
worker processes, Ray actors: `env_workers`) is the pool's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tqdm.auto import tqdm

from agentgym_opsd import core
from agentgym_opsd.envpool import BaseEnvPool, EnvFactory, StepResult, TaskSpec, make_env_pool
from agentgym_opsd.parsers import ActionParser, ParsedAction, make_parser
from agentgym_opsd.policies import Policy, PolicyOutput, PolicyRequest
from agentgym_opsd.prompts import TEACHER_CONTEXTS, HistoryItem, PromptRenderer
from agentgym_opsd.records import Trajectory, Turn
from agentgym_opsd.registry import EnvProfile, env_profile, load_skill_library, parse_env_spec
from agentgym_opsd.turns import history_item, record_turn

__all__ = ["RolloutRunner"]


@dataclass
class _Episode:
    traj: Trajectory
    observation: str
    admissible: list[str] | None
    history: list[HistoryItem] = field(default_factory=list)
    oracle_distance: int | None = None  # the environment's last reported distance (before the next action)


class RolloutRunner:
    """Plays policies on one environment id (optionally `Env-v0:split`).

    `env_workers` says where the `num_envs` environments run: `threads` (this process), `processes` or `ray`
    (`num_env_workers` workers, default one per core; see `agentgym_opsd.envpool`). `env_fn` makes each
    environment instead of `make(env_spec, **env_kwargs)` (picklable for processes and ray), e.g. a server's
    session (`integrations.openenv_session.SessionEnv`)."""

    def __init__(
        self,
        env_spec: str,
        *,
        num_envs: int,
        env_kwargs: dict[str, Any] | None = None,
        profile: EnvProfile | None = None,
        renderer: PromptRenderer | None = None,
        parser: ActionParser | None = None,
        use_skills: bool = True,
        step_timeout_s: float = 60.0,
        max_prompt_chars: int = 0,
        hint_level: str = "",
        env_workers: str = "threads",
        num_env_workers: int | None = None,
        env_fn: Callable[[], Any] | None = None,
    ) -> None:
        self.env_spec = env_spec
        self.hint_level = hint_level  # which of the env's privileged hints to record ("" = none)
        self.env_id, split = parse_env_spec(env_spec)
        self.profile = profile or env_profile(self.env_id)
        kwargs = dict(env_kwargs or {})
        if env_fn is not None and kwargs:
            raise ValueError("RolloutRunner takes env_kwargs or env_fn, not both (env_fn makes the environments)")
        self.pool: BaseEnvPool = make_env_pool(env_workers, env_fn or EnvFactory.for_spec(env_spec, kwargs), num_envs,
                                               step_timeout_s=step_timeout_s, num_workers=num_env_workers)
        self.renderer = renderer or PromptRenderer(
            self.profile.system_prompt, history_turns=self.profile.history_turns, max_chars=max_prompt_chars
        )
        self.parser = parser or make_parser(self.profile.parser)
        self.skills = load_skill_library(self.profile.skill_library) if use_skills and self.profile.skill_library else None

    def close(self) -> None:
        self.pool.close()

    def skill_context(self, task_type: str, task_text: str) -> str:
        return self.skills.context_for(task_type=task_type, text=task_text) if self.skills else ""

    def teacher_messages(self, traj: Trajectory, turn: Turn, context: str = "skills") -> list[dict[str, str]]:
        """The turn's prompt with the teacher's privileged `context` in the system message (`TEACHER_CONTEXTS`:
        the skill text c+, the trajectory's recorded hint, or both); the rest of the prompt is the student's."""
        if context not in TEACHER_CONTEXTS:
            raise ValueError(f"teacher context must be one of {TEACHER_CONTEXTS}, got {context!r}")
        messages = [dict(m) for m in turn.prompt]
        messages[0]["content"] = self.renderer.system_message(
            traj.skill_context if context != "hint" else "", traj.privileged_hint if context != "skills" else "")
        return messages

    def privileged_hint(self, info: dict[str, Any]) -> str:
        """The hint of the runner's `hint_level` from a reset's info ("" when no level is chosen)."""
        if not self.hint_level:
            return ""
        hints = info.get(core.PRIVILEGED_HINTS) or {}
        if self.hint_level not in hints:
            raise ValueError(f"{self.env_id} offers the privileged hint levels {sorted(hints)}, not "
                             f"{self.hint_level!r} (info['{core.PRIVILEGED_HINTS}'] on reset)")
        return str(hints[self.hint_level])

    def run(
        self,
        policy: Policy,
        tasks: Sequence[TaskSpec],
        *,
        group_size: int = 1,
        first_group_id: int = 0,
        first_traj_id: int = 0,
        progress: bool = False,
    ) -> list[Trajectory]:
        """Play every task `group_size` times; returns trajectories ordered task-major, copy-minor."""
        starts = self.pool.reset(tasks, group_size)
        episodes: dict[int, _Episode] = {}
        for i, start in enumerate(starts):
            t = i // group_size
            info = start.info
            task_type, task_text = str(info.get(core.TASK_TYPE, "")), str(info.get(core.TASK_TEXT, ""))
            traj = Trajectory(
                env_id=self.env_id,
                task_id=str(info.get(core.TASK_ID, "")),
                task_type=task_type,
                group_id=first_group_id + t,
                traj_id=first_traj_id + i,
                seed=tasks[t].seed,
                task_text=task_text,
                skill_context=self.skill_context(task_type, task_text),
                privileged_hint=self.privileged_hint(info) if start.error is None else "",
                error=start.error,
                won=bool(info.get(core.WON, False)),
                score=float(info.get(core.SCORE, 0.0)),
                terminated=start.terminated,
                metadata={k: v for k, v in info.items() if k not in core.INFO_KEYS and _is_json_scalar(v)},
            )
            episodes[i] = _Episode(traj, start.observation, info.get(core.ADMISSIBLE_ACTIONS),
                                   oracle_distance=info.get(core.ORACLE_DISTANCE))
        bar = tqdm(desc=f"rollout {self.env_spec}", unit="turn", disable=not progress, leave=False)
        try:
            while active := [i for i in episodes if self.pool.active[i]]:
                self._play_turn(policy, {i: episodes[i] for i in active})
                bar.update(1)
                bar.set_postfix(active=len(active))
        finally:
            bar.close()
        return [episodes[i].traj for i in range(len(starts))]

    def _play_turn(self, policy: Policy, episodes: dict[int, _Episode]) -> None:
        indices = list(episodes)
        oracle = _TurnOracle(self.pool, indices)
        requests = []
        for i in indices:
            ep = episodes[i]
            messages = self.renderer.render(
                task_text=ep.traj.task_text,
                observation=ep.observation,
                history=ep.history,
                admissible_actions=ep.admissible,
                turn_index=len(ep.traj.turns),
            )
            requests.append(PolicyRequest(messages, ep.admissible, oracle.of(i), self.parser.format))
        outputs = policy.act(requests)
        if len(outputs) != len(requests):
            raise RuntimeError(f"policy answered {len(outputs)} of {len(requests)} requests")
        failed = {i: out.error for i, out in zip(indices, outputs, strict=True) if out.error}
        for i, reason in failed.items():
            # The policy gave no answer for this episode: end it flagged (no action sent), keep the others.
            episodes[i].traj.error = f"policy failed: {reason}"
            episodes[i].traj.truncated = True
            self.pool.active[i] = False
        parsed = {i: self.parser.parse(out.text) for i, out in zip(indices, outputs, strict=True) if i not in failed}
        results = self.pool.step({i: parsed[i].action for i in parsed}) if parsed else {}
        for i, req, out in zip(indices, requests, outputs, strict=True):
            if i not in failed:
                self._record(episodes[i], req, out, parsed[i], results[i])

    def _record(self, ep: _Episode, req: PolicyRequest, out: PolicyOutput, parsed: ParsedAction, res: StepResult) -> None:
        turn = record_turn(index=len(ep.traj.turns), prompt=req.messages, text=out.text, parsed=parsed,
                           observation=res.observation, reward=res.reward, info=res.info, error=res.error,
                           finish_reason=out.finish_reason, token_ids=out.token_ids, logprobs=out.logprobs,
                           admissible_actions=req.admissible_actions, distance_before=ep.oracle_distance)
        if core.ORACLE_DISTANCE in res.info:
            ep.oracle_distance = res.info[core.ORACLE_DISTANCE]
        traj = ep.traj
        traj.turns.append(turn)
        traj.total_reward += res.reward
        traj.won = bool(res.info.get(core.WON, traj.won))
        traj.score = float(res.info.get(core.SCORE, traj.score))
        traj.terminated, traj.truncated = res.terminated, res.truncated
        traj.error = res.error
        ep.history.append(history_item(turn, ep.observation))
        ep.observation = res.observation
        ep.admissible = res.info.get(core.ADMISSIBLE_ACTIONS)


class _TurnOracle:
    """The expert's next actions for one turn's environments, asked of the pool on first use and then for
    all of them at once: only scripted policies ask, and an out-of-process pool answers a batch with one
    round trip per worker, the workers in parallel, instead of one round trip per request."""

    def __init__(self, pool: BaseEnvPool, indices: list[int]) -> None:
        self.pool, self.indices = pool, indices
        self._answers: dict[int, str | Exception] | None = None

    def of(self, index: int) -> Callable[[], str]:
        return partial(self._answer, index)

    def _answer(self, index: int) -> str:
        if self._answers is None:
            self._answers = self.pool.oracle_actions(self.indices)
        answer = self._answers[index]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _is_json_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None
