"""Every registered environment honours the turn API (Gymnasium's env checker, seeded determinism, the
standard info keys, an oracle that wins, answers instead of exceptions for bad actions)."""

from __future__ import annotations

import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentgym_opsd.core import INFO_KEYS
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


def test_gymnasium_env_checker(env):
    check_env(env.unwrapped, skip_render_check=True)


def test_info_keys_and_seeded_determinism(env):
    obs1, info1 = env.reset(seed=123)
    obs2, info2 = env.reset(seed=123)
    assert obs1 == obs2 and info1["task_id"] == info2["task_id"]
    assert set(INFO_KEYS) <= set(info1)
    _, _, _, _, info = env.step(env.unwrapped.oracle_action())
    assert set(INFO_KEYS) <= set(info)


def test_oracle_wins(env):
    env.reset(seed=5)
    profile = env_profile(env.spec.id)
    for _ in range(profile.max_turns):
        _, _, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        if terminated or truncated:
            break
    assert info["won"], f"oracle lost on {env.spec.id}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.one_of(st.just(""), st.just("   "), st.text(max_size=200), st.just("x" * 10_000),
                        st.just("ünïcødé ✓ 行動"), st.just("go\x00to\x1b[31m")))
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


@pytest.mark.parametrize("index", [-1, "end"])
def test_task_index_out_of_range_is_refused_alike(env, index):
    # every environment refuses an index outside [0, num_tasks) instead of wrapping it to another task
    bad = env.unwrapped.num_tasks if index == "end" else index
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": bad})
    env.reset(options={"task_index": env.unwrapped.num_tasks - 1})  # the last one is fine
