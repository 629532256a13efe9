"""ALFWorld-v0: ALFWorld's text on real-format games, the oracle, bad input, registry and skills."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("textworld")
pytest.importorskip("alfworld")

from agentgym_opsd.environments.alfworld.env import ALFWorldEnv  # noqa: E402
from agentgym_opsd.environments.alfworld.splits import NoGamesError  # noqa: E402
from agentgym_opsd.environments.alfworld.vocabulary import TASK_TYPES  # noqa: E402

FIXTURES = Path(__file__).parent / "data" / "alfworld"  # 7 ALFWorld games in its on-disk layout
FIXTURE_GAMES = sorted(glob.glob(str(FIXTURES / "json_2.1.1/*/*/*/game.tw-pddl")))
needs_fixtures = pytest.mark.skipif(not FIXTURE_GAMES, reason="ALFWorld fixture games not present")


pytestmark = pytest.mark.usefixtures("fresh_cache_dir")  # generated games go to a private, empty cache


def play_oracle(env: ALFWorldEnv, **reset_kwargs) -> tuple[dict, int]:
    """Play the oracle to the end; returns the last step's info (plus the reset's optimal_plan_length)."""
    _, info = env.reset(**reset_kwargs)
    plan_length = info["optimal_plan_length"]
    turns, done = 0, False
    while not done:
        _, reward, terminated, truncated, info = env.step(env.oracle_action())
        turns += 1
        done = terminated or truncated
    return {**info, "optimal_plan_length": plan_length}, turns


@needs_fixtures
@pytest.mark.parametrize("game", FIXTURE_GAMES, ids=lambda g: Path(g).parts[-3])
def test_engine_text_matches_alfworld(game):
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler

    from agentgym_opsd.environments.alfworld.engine import AlfredEngine

    ref = textworld.start(game, request_infos=textworld.EnvInfos(won=True, admissible_commands=True),
                          wrappers=[AlfredDemangler()])
    engine = AlfredEngine()
    engine.load(game)
    ours, theirs = engine.reset(), ref.reset()
    assert ours.observation == theirs.feedback
    assert ours.admissible_commands == theirs.admissible_commands
    for command in [*engine.plan(), "jump around"]:
        theirs, _, _ = ref.step(command)
        ours = engine.step(command)
        assert (ours.observation, ours.admissible_commands, ours.won) == (
            theirs.feedback, theirs.admissible_commands, theirs.won)


@needs_fixtures
@pytest.mark.parametrize("split,count", [("valid_seen", 6), ("train", 1)])
def test_real_data_oracle_wins(split, count, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(FIXTURES))
    env = ALFWorldEnv(split=split, data_source="real")
    assert env.num_tasks == count
    for index in range(count):
        info, turns = play_oracle(env, options={"task_index": index})
        assert info["won"] and turns == info["optimal_plan_length"]


@needs_fixtures
def test_real_data_reset_info(monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(FIXTURES))
    env = ALFWorldEnv(split="valid_seen", data_source="real")
    obs, info = env.reset(options={"task_index": 0})
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert info["task_type"] in TASK_TYPES and info["task_text"] and f"Your task is to: {info['task_text']}." in obs
    assert info["optimal_plan_length"] > 0 and info["data_source"] == "real"
    again = env.reset(options={"task_id": info["task_id"]})[1]
    assert again["task_id"] == info["task_id"]


def test_empty_real_split_raises(tmp_path):
    (tmp_path / "json_2.1.1" / "valid_seen").mkdir(parents=True)
    with pytest.raises(NoGamesError, match="no playable ALFWorld games"):
        ALFWorldEnv(split="valid_seen", data_source="real", data_root=tmp_path)
    with pytest.raises(ValueError, match="ALFWORLD_DATA"):
        os.environ.pop("ALFWORLD_DATA", None)
        ALFWorldEnv(split="valid_seen", data_source="real")


@pytest.fixture(scope="module")
def easy_env():
    env = ALFWorldEnv(split="easy")
    yield env
    env.close()


@pytest.mark.parametrize("index", range(6))
def test_easy_oracle_wins_each_task_type(easy_env, index):
    info, turns = play_oracle(easy_env, options={"task_index": index})
    assert info["won"] and info["task_type"] == TASK_TYPES[index]
    assert turns == info["optimal_plan_length"] <= 8


def test_reward_is_one_at_the_winning_step(easy_env):
    easy_env.reset(options={"task_index": 0})
    rewards = []
    done = False
    while not done:
        _, reward, terminated, truncated, info = easy_env.step(easy_env.oracle_action())
        rewards.append(reward)
        done = terminated or truncated
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0 and info["score"] == 1.0


def test_oracle_recovers_after_deviation(easy_env):
    _, info = easy_env.reset(options={"task_index": 5})
    for _ in range(4):  # wander: go somewhere the plan does not go first
        wander = [a for a in info["admissible_actions"] if a.startswith("go to")]
        _, _, terminated, _, info = easy_env.step(wander[-1])
        assert not terminated
    done = False
    while not done:
        _, _, terminated, truncated, info = easy_env.step(easy_env.oracle_action())
        done = terminated or truncated
    assert info["won"]


def test_same_seed_same_episode(easy_env):
    first = easy_env.reset(seed=123)
    second = easy_env.reset(seed=123)
    assert first[0] == second[0] and first[1]["task_id"] == second[1]["task_id"]


def test_turn_limit_truncates():
    env = ALFWorldEnv(split="easy", max_turns=2)
    env.reset(options={"task_index": 0})
    env.step("look")
    _, _, terminated, truncated, _ = env.step("look")
    assert truncated and not terminated


BAD_ACTIONS = ["", "   ", "x" * 10_000, "ñandú ☃ 日本", "go to\x00 cabinet\x1b[1", "\n\t", "GO TO CABINET 1"]


@pytest.mark.parametrize("action", BAD_ACTIONS, ids=range(len(BAD_ACTIONS)))
def test_bad_actions_are_answered(easy_env, action):
    _, info = easy_env.reset(options={"task_index": 2})
    obs, reward, terminated, truncated, step_info = easy_env.step(action)
    assert obs == "Nothing happens." and reward == 0.0 and not terminated
    assert step_info["action_valid"] is False and step_info["admissible_actions"] == info["admissible_actions"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(action=st.text(max_size=300))
def test_fuzz_actions_never_raise(easy_env, action):
    if easy_env.episode_ended:
        easy_env.reset(options={"task_index": 1})
    admissible = list(easy_env.unwrapped._admissible)
    obs, _, _, _, info = easy_env.step(action)
    assert isinstance(obs, str) and obs
    assert info["action_valid"] == (action.strip() in admissible)


def test_actions_after_the_end(easy_env):
    play_oracle(easy_env, options={"task_index": 0})
    obs, reward, terminated, _, info = easy_env.step("look")
    assert info["action_valid"] is False and terminated and reward == 0.0 and obs


def test_registry_profile_and_make():
    from agentgym_opsd.registry import env_profile, make, registered_envs

    assert "agentgym_opsd/ALFWorld-v0" in registered_envs()
    profile = env_profile("ALFWorld-v0")
    assert profile.parser == "tag:action" and profile.history_turns == 2 and profile.max_turns == 50
    assert profile.invalid_action_penalty == 0.1 and profile.skill_library == "alfworld"
    assert profile.splits == ("train", "valid_seen", "valid_unseen", "easy", "easy_valid")
    env = make("ALFWorld-v0:easy")
    assert env.unwrapped.split == "easy" and env.unwrapped.num_tasks == 120


def test_skill_library_by_task_type():
    from agentgym_opsd.registry import load_skill_library

    library = load_skill_library("alfworld")
    assert set(library.task_types) == set(TASK_TYPES)
    texts = {library.specific_for(task_type=t) for t in TASK_TYPES}
    assert len(texts) == 6 and all(texts)
    assert "microwave" in library.context_for(text="put a hot apple in fridge")


def test_action_case_matching_is_exact_by_default_and_lower_cased_on_request():
    from agentgym_opsd.registry import make

    exact, lower = (make("ALFWorld-v0:easy", lowercase_actions=flag) for flag in (False, True))
    try:
        for env in (exact, lower):
            env.reset(options={"task_index": 0})
        shouted = "  " + exact.unwrapped.oracle_action().upper() + " "
        assert not exact.step(shouted)[4]["action_valid"]  # exact: the case must match ALFWorld's commands
        assert lower.step(shouted)[4]["action_valid"]  # released trainer: lower-cased, whitespace ignored
    finally:
        exact.close()
        lower.close()
