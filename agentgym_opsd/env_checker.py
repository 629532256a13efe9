"""`check_env(env)`: does an environment honour the turn API? Run it on your own environment before training.

What every environment of agentgym-opsd must do (the conformance suite runs this over every registered one):
pass Gymnasium's own `check_env`; put the standard `INFO_KEYS` in `info` on reset and on every step; give the
same episode for the same seed (observation, task and, played with the same actions, every step); have an
oracle that wins the task within the turn limit; answer a bad action (empty, garbage, very long, control
characters) with an observation, `action_valid=False`, no reward and no end, instead of raising; raise
TypeError for an action that is not a string (None, 5, bytes, a list, a dict), leaving the episode as it was;
refuse a `task_index` outside `[0, num_tasks)` instead of wrapping it to another task.

    from agentgym_opsd import check_env, make
    check_env(make("MyEnv-v0"))  # raises EnvCheckError naming what is wrong

Each failure is an `EnvCheckError` (an AssertionError, as Gymnasium's checker raises) whose message names the
environment, the check and what was expected.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
from gymnasium.utils.env_checker import check_env as gymnasium_check_env

from agentgym_opsd.core import ACTION_VALID, ADMISSIBLE_ACTIONS, INFO_KEYS, TASK_ID, WON, TextEnv

__all__ = ["BAD_ACTIONS", "NON_STRING_ACTIONS", "EnvCheckError", "check_env"]

BAD_ACTIONS = ("", "   ", "x" * 10_000, "ünïcødé ✓ 行動", "go\x00to\x1b[31m")
"""Actions no environment should accept (unless it lists them as admissible), each answered, never raised."""

NON_STRING_ACTIONS: tuple[Any, ...] = (None, 5, 1.5, True, b"look", ["look"], {"action": "look"})
"""Values that are not actions at all: `step` raises TypeError for each (a caller's bug, not an agent's move)."""


class EnvCheckError(AssertionError):
    """An environment breaks the turn API; the message names the environment and the check."""


def check_env(env: gym.Env, *, seed: int = 123, skip_gymnasium: bool = False) -> None:
    """Check that `env` (made by `agentgym_opsd.make` or constructed directly) honours the turn API; raises
    `EnvCheckError` at the first problem. `seed` is the episode the checks play; `skip_gymnasium` leaves out
    Gymnasium's own checker (e.g. when it has already run). The environment is left reset."""
    text_env = env.unwrapped
    name = env.spec.id if env.spec is not None else type(text_env).__name__
    if not isinstance(text_env, TextEnv):
        raise EnvCheckError(f"{name}: expected a subclass of agentgym_opsd.core.TextEnv (it keeps the turn "
                            f"bookkeeping and the standard info keys), got {type(text_env).__qualname__}")
    if not skip_gymnasium:
        try:
            gymnasium_check_env(text_env, skip_render_check=True)
        except AssertionError as exc:
            raise EnvCheckError(f"{name}: Gymnasium's env checker: {exc}") from exc
    _check_seeded_reset(env, name, seed)
    _check_oracle_episode(env, name, seed)
    _check_bad_actions(env, name, seed)
    _check_non_string_actions(env, name, seed)
    _check_task_index_range(env, name)
    env.reset(seed=seed)


def _missing_keys(info: dict[str, Any], name: str, where: str) -> None:
    missing = [key for key in INFO_KEYS if key not in info]
    if missing:
        raise EnvCheckError(f"{name}: info after {where} lacks {', '.join(missing)}; every environment gives "
                            f"{', '.join(INFO_KEYS)} (agentgym_opsd.core.INFO_KEYS)")


def _check_seeded_reset(env: gym.Env, name: str, seed: int) -> None:
    obs1, info1 = env.reset(seed=seed)
    obs2, info2 = env.reset(seed=seed)
    _missing_keys(info1, name, "reset")
    if not isinstance(obs1, str):
        raise EnvCheckError(f"{name}: reset returned a {type(obs1).__name__} observation, expected text (str)")
    if (obs1, info1[TASK_ID]) != (obs2, info2[TASK_ID]):
        raise EnvCheckError(f"{name}: reset(seed={seed}) twice gave different episodes (task_id "
                            f"{info1[TASK_ID]!r} then {info2[TASK_ID]!r}); draw the task from self.np_random, "
                            "seeded by super().reset(seed=seed)")


def _play_oracle(env: gym.Env, name: str, seed: int) -> list[tuple[str, tuple[Any, ...]]]:
    """One oracle episode from `seed`: each action with the step's result."""
    env.reset(seed=seed)
    steps = []
    for _ in range(env.unwrapped.max_turns):
        action = env.unwrapped.oracle_action()
        result = env.step(action)
        _missing_keys(result[4], name, f"step({action!r})")
        steps.append((action, result))
        if result[2] or result[3]:
            break
    return steps


def _check_oracle_episode(env: gym.Env, name: str, seed: int) -> None:
    first = _play_oracle(env, name, seed)
    if not first[-1][1][4][WON]:
        raise EnvCheckError(f"{name}: the oracle did not win the episode of seed {seed} within {len(first)} turns "
                            f"(actions {[a for a, _ in first][:10]}); oracle_action() should give an expert's "
                            "winning next action")
    again = _play_oracle(env, name, seed)
    for turn, (one, two) in enumerate(zip(first, again, strict=False)):
        if one != two:
            raise EnvCheckError(f"{name}: the oracle episode of seed {seed} played twice differs at turn {turn}: "
                                f"{one[0]!r} -> {one[1][:4]} then {two[0]!r} -> {two[1][:4]}; the same seed and "
                                "actions must give the same episode")
    if len(first) != len(again):
        raise EnvCheckError(f"{name}: the oracle episode of seed {seed} took {len(first)} turns, then {len(again)}")


def _check_bad_actions(env: gym.Env, name: str, seed: int) -> None:
    for action in BAD_ACTIONS:
        _, start = env.reset(seed=seed)
        if action.strip() in (start.get(ADMISSIBLE_ACTIONS) or ()):
            continue
        try:
            obs, reward, terminated, _, info = env.step(action)
        except Exception as exc:
            raise EnvCheckError(f"{name}: step({action[:40]!r}) raised {type(exc).__name__}: {exc}; a bad action "
                                "is answered with an observation and action_valid=False, never raised") from exc
        problems = [what for what, bad in (
            ("an empty or non-text observation", not (isinstance(obs, str) and obs)),
            (f"action_valid={info.get(ACTION_VALID)!r} (expected False)", info.get(ACTION_VALID) is not False),
            (f"reward {reward!r} (expected 0.0)", reward != 0.0),
            ("terminated=True", terminated), ("won=True", info.get(WON)),
        ) if bad]
        if problems:
            raise EnvCheckError(f"{name}: the bad action {action[:40]!r} got {', '.join(problems)}; a bad action "
                                "is answered, not rewarded, and does not end the episode")


def _check_non_string_actions(env: gym.Env, name: str, seed: int) -> None:
    env.reset(seed=seed)
    for action in NON_STRING_ACTIONS:
        try:
            env.step(action)
        except TypeError:
            continue
        except Exception as exc:
            raise EnvCheckError(f"{name}: step({action!r}) raised {type(exc).__name__}: {exc}; an action that is "
                                "not a str is a TypeError") from exc
        raise EnvCheckError(f"{name}: step({action!r}) was played; an action that is not a str is a TypeError "
                            "(TextEnv.step raises it: an override of step must keep that)")
    if env.unwrapped.turn != 0:
        raise EnvCheckError(f"{name}: refused non-string actions counted as turns ({env.unwrapped.turn}); the "
                            "TypeError must leave the episode as it was")


def _check_task_index_range(env: gym.Env, name: str) -> None:
    num_tasks = env.unwrapped.num_tasks
    for bad in (-1, num_tasks):
        try:
            env.reset(options={"task_index": bad})
        except ValueError as exc:
            if "task_index" not in str(exc):
                raise EnvCheckError(f"{name}: reset(options={{'task_index': {bad}}}) raised ValueError without "
                                    f"naming task_index: {exc}") from exc
            continue
        raise EnvCheckError(f"{name}: reset(options={{'task_index': {bad}}}) was accepted; expected a ValueError "
                            f"naming task_index (valid: 0 to {num_tasks - 1}), not a wrap to another task")
    env.reset(options={"task_index": num_tasks - 1})
