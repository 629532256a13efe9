"""Every registered environment honours the turn API: `agentgym_opsd.check_env` (Gymnasium's env checker,
the standard info keys, seeded determinism, an oracle that wins, answers instead of exceptions for bad actions,
task indices out of range refused) over the registry (the example plugin included when installed), fuzzed
bad actions, and two instances that play alike. And `check_env` names what is wrong in a broken environment."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from toy_envs import CounterEnv

from agentgym_opsd import EnvCheckError, check_env
from agentgym_opsd.registry import env_profile, make, registered_envs

ENV_IDS = [e for e in registered_envs() if "Toy" not in e]
CONFORMANCE_KWARGS = {  # the cheapest configuration of each environment
    "agentgym_opsd/ALFWorld-v0": {"split": "easy"},
}


@pytest.fixture(scope="module", params=ENV_IDS)
def env(request):
    env = make(request.param, **CONFORMANCE_KWARGS.get(request.param, {}))
    yield env
    env.close()


def test_check_env(env):
    check_env(env)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.text(max_size=200))  # check_env tries the classic bad actions; this fuzzes beyond them
def test_bad_actions_are_answered(env, action):
    _, start = env.reset(seed=1)
    assume(action.strip() not in (start["admissible_actions"] or ()))
    obs, reward, terminated, truncated, info = env.step(action)
    assert isinstance(obs, str) and obs
    assert info["action_valid"] is False and reward == 0.0 and not terminated and not info["won"]


def test_two_instances_play_the_same_oracle_episode_identically(env):
    other = make(env.spec.id, **CONFORMANCE_KWARGS.get(env.spec.id, {}))
    try:
        first = [env.reset(seed=77), other.reset(seed=77)]
        assert first[0] == first[1]
        for _ in range(env_profile(env.spec.id).max_turns):
            action = env.unwrapped.oracle_action()
            assert other.unwrapped.oracle_action() == action
            a, b = env.step(action), other.step(action)
            assert a == b, f"{env.spec.id} diverged on {action!r}"
            if a[2] or a[3]:
                break
        assert a[4]["won"]
    finally:
        other.close()


# ---- check_env names what is wrong ---------------------------------------------------------------------------


class _Counter(CounterEnv):
    """The toy counter, made conforming: it refuses task indices out of range instead of wrapping them."""

    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        index = options.get("task_index")
        if index is not None and not 0 <= index < self.num_tasks:
            raise ValueError(f"task_index must be in [0, {self.num_tasks}), got {index}")
        return super()._reset_task(options)


class _DropsTheScore(_Counter):
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        del info["score"]
        return obs, reward, terminated, truncated, info


class _OracleLoses(_Counter):
    def oracle_action(self) -> str:
        return "dec"


class _RaisesOnGarbage(_Counter):
    def _step_action(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        if action not in ("inc", "dec"):
            raise KeyError(action)
        return super()._step_action(action)


class _WrapsTaskIndices(CounterEnv):
    pass


class _UnseededTasks(_Counter):
    def _reset_task(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return super()._reset_task({"task_index": random.randrange(self.num_tasks), **options})


def test_check_env_passes_a_conforming_environment() -> None:
    check_env(_Counter())


@pytest.mark.parametrize(("broken", "message"), [
    (_DropsTheScore, r"info after step\('inc'\) lacks score"),
    (_OracleLoses, "the oracle did not win"),
    (_RaisesOnGarbage, r"step\(''\) raised KeyError"),
    (_WrapsTaskIndices, r"task_index': -1}\) was accepted"),
    (_UnseededTasks, "different episodes|played twice differs"),
])
def test_check_env_names_what_is_wrong(broken: type, message: str) -> None:
    with pytest.raises(EnvCheckError, match=message):
        check_env(broken(), skip_gymnasium=True)


def test_check_env_refuses_what_is_not_a_text_env() -> None:
    import gymnasium as gym

    with pytest.raises(EnvCheckError, match="TextEnv"):
        check_env(gym.make("CartPole-v1"))


@pytest.mark.parametrize("action", [None, 5, 1.5, True, b"look", bytearray(b"look"), ["look"], {"action": "look"},
                                    ("look",), object()])
def test_a_non_string_action_is_a_type_error_and_the_episode_goes_on(env, action):
    """Issue 45, hole 8: such actions were played as '' or str(action). A TypeError naming the type, before the
    turn counts; the next real action plays as if the bad call never happened."""
    first = env.reset(seed=5)
    oracle = env.unwrapped.oracle_action()
    with pytest.raises(TypeError, match=rf"step: the action must be a str .*got {type(action).__name__}"):
        env.step(action)
    assert env.unwrapped.turn == 0
    played = env.step(oracle)
    fresh = make(env.spec.id, **CONFORMANCE_KWARGS.get(env.spec.id, {}))
    try:
        assert fresh.reset(seed=5) == first
        assert fresh.step(oracle) == played
    finally:
        fresh.close()


def test_check_env_names_a_step_that_plays_a_non_string_action():
    class Lenient(CounterEnv):
        def step(self, action):
            return super().step(str(action))

    with pytest.raises(EnvCheckError, match=r"step\(None\) was played; an action that is not a str is a TypeError"):
        check_env(Lenient(), skip_gymnasium=True)
