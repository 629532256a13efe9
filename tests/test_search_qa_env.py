"""SearchQA-v0: registration, the oracle solves every kind, format rules and bad input, rollouts."""

from __future__ import annotations

from collections import Counter

import pytest

from agentgym_opsd.environments.search_qa.embedding import HashingEncoder
from agentgym_opsd.environments.search_qa.env import INVALID_ACTION_MESSAGE, SearchQAEnv
from agentgym_opsd.environments.search_qa.generator import generate_dataset
from agentgym_opsd.environments.search_qa.index import IndexConfig, write_index_folder
from agentgym_opsd.environments.search_qa.retriever import DenseRetriever
from agentgym_opsd.envpool import TaskSpec
from agentgym_opsd.policies import OraclePolicy
from agentgym_opsd.registry import env_profile, make
from agentgym_opsd.rollout import RolloutRunner


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    """A cache with the tiny world built by the real first-use path (MiniLM)."""
    return str(tmp_path_factory.mktemp("sqa-cache"))


def _play_oracle(env) -> tuple[float, int, dict]:
    u = env.unwrapped
    total, turns, info, done = 0.0, 0, {}, False
    while not done:
        _, reward, terminated, truncated, info = env.step(u.oracle_action())
        total, turns, done = total + reward, turns + 1, terminated or truncated
    return total, turns, info


def test_registered_with_profile() -> None:
    profile = env_profile("SearchQA-v0")
    assert profile.parser == "tag:search,answer" and profile.max_turns == 4 and profile.history_turns == 4
    assert profile.invalid_action_penalty == 0.01 and profile.skill_library == "search_qa"
    assert profile.splits == ("train", "test")


@pytest.mark.parametrize("split", ["train", "test"])
def test_oracle_solves_every_kind(cache: str, split: str) -> None:
    env = make(f"SearchQA-v0:{split}", corpus="tiny", cache_dir=cache)
    won, seen = Counter(), Counter()
    for i in range(env.unwrapped.num_tasks):
        _, info = env.reset(options={"task_index": i})
        assert isinstance(info["num_hops"], int) and info["admissible_actions"] is None
        reward, turns, last = _play_oracle(env)
        assert turns <= info["num_hops"] + 1 <= 4
        seen[info["task_type"]] += 1
        won[info["task_type"]] += int(last["won"] and reward == 1.0)
    assert set(seen) == {"single_hop", "multi_hop", "comparison"}
    assert won == seen


def test_seed_picks_the_task(cache: str) -> None:
    env = make("SearchQA-v0:train", corpus="tiny", cache_dir=cache)
    assert env.reset(seed=3)[0] == env.reset(seed=3)[0]
    assert len({env.reset(seed=s)[1]["task_id"] for s in range(20)}) > 3
    first = env.unwrapped.questions[5]
    assert env.reset(options={"task_id": first.id})[1]["task_text"] == first.question


@pytest.fixture(scope="module")
def fast_env(tmp_path_factory):
    """The env over a hashing-encoder index (no model): for format rules."""
    data = generate_dataset("tiny")
    folder = write_index_folder(tmp_path_factory.mktemp("fast") / "idx", data.passages, HashingEncoder().encode,
                                IndexConfig(kind="flat"), progress=False)
    retriever = DenseRetriever(folder, encoder=HashingEncoder().encode)
    from agentgym_opsd.environments.search_qa.formats import write_questions

    qa = folder.parent / "test.jsonl"
    write_questions(qa, data.questions["test"])
    return SearchQAEnv(split="test", questions_path={"test": str(qa)}, index_dir=str(folder), retriever=retriever)


@pytest.mark.parametrize("action", [
    "", "no tags at all", "<search>" + "x" * 100_000 + "</search>", "<search>unclosed", "\udcff\udcfe",
    "<SEARCH>a</SEARCH>",
])
def test_bad_actions_are_invalid_not_errors(fast_env, action: str) -> None:
    fast_env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = fast_env.step(action)
    assert obs == INVALID_ACTION_MESSAGE and reward == 0.0 and not terminated and not truncated
    assert info["action_valid"] is False


@pytest.mark.parametrize("action, searched", [
    ("<search></search>", ""), ("<search>   </search>", ""), ("<search>a</search><answer>b</answer>", "a"),
    ("<search>a</search> <search>b</search>", "a"),
])
def test_the_first_complete_tag_is_acted_on_as_in_search_r1(fast_env, action: str, searched: str) -> None:
    fast_env.reset(options={"task_index": 0})
    obs, reward, terminated, _, info = fast_env.step(action)
    assert info["action_valid"] and obs.startswith("\n\n<information>Doc 1(Title: \"") and not terminated
    assert fast_env.unwrapped._queries == {searched}


def test_an_empty_answer_is_an_answer(fast_env) -> None:
    fast_env.reset(options={"task_index": 0})
    obs, reward, terminated, _, info = fast_env.step("<answer></answer>")
    assert info["action_valid"] and terminated and reward == 0.0 and not info["won"]


def test_information_block_is_rendered_as_search_r1_does(fast_env) -> None:
    fast_env.reset(options={"task_index": 0})
    obs, *_ = fast_env.step("<search>anything</search>")
    assert obs.startswith("\n\n<information>Doc 1(Title: \"") and obs.endswith("</information>\n\n")
    docs = obs.strip()[len("<information>"):-len("</information>")].split("\n")
    assert [d.split("(Title: ")[0] for d in docs] == ["Doc 1", "Doc 2", "Doc 3"]
    assert all(d.split("(Title: ", 1)[1].startswith('"') for d in docs)


def test_search_answer_and_turn_limit(fast_env) -> None:
    fast_env.reset(options={"task_index": 0})
    q = fast_env.question
    obs, _, term, _, info = fast_env.step("<search>\udcff odd bytes</search>")
    assert obs.startswith("\n\n<information>Doc 1(Title: ") and obs.count("\nDoc ") == 2 and info["action_valid"]
    obs, reward, term, _, info = fast_env.step(f"<answer>The {q.golden_answers[0].upper()}!</answer>")
    assert term and reward == 1.0 and info["won"] and info["score"] == 1.0
    fast_env.reset(options={"task_index": 0})
    for _turn in range(4):  # max_turns = 4 search turns, as Search-R1 counts them ...
        obs, reward, term, trunc, info = fast_env.step("<search>x</search>")
        assert obs.count("Doc ") == 3 and not (term or trunc)
    # ... then one final turn for the answer, in which a search runs no retrieval
    obs, reward, term, trunc, info = fast_env.step("<search>x</search>")
    assert obs == "\n\n<information></information>\n\n" and trunc and not term and not info["won"] and reward == 0.0
    fast_env.reset(options={"task_index": 0})
    for _turn in range(4):
        fast_env.step("<search>x</search>")
    _, reward, term, trunc, info = fast_env.step(f"<answer>{q.golden_answers[0]}</answer>")
    assert term and reward == 1.0 and info["won"]
    fast_env.reset(options={"task_index": 0})
    _, reward, term, _, info = fast_env.step("<answer>surely wrong</answer>")
    assert term and reward == 0.0 and not info["won"]


def test_bad_config_is_named() -> None:
    with pytest.raises(TypeError, match="colour"):
        SearchQAEnv(colour="red")
    with pytest.raises(ValueError, match="topk"):
        SearchQAEnv(topk=0)
    with pytest.raises(ValueError, match="split"):
        SearchQAEnv(split="dev", corpus="tiny")


def test_oracle_rollout_through_runner(cache: str) -> None:
    runner = RolloutRunner("SearchQA-v0:test", num_envs=4, env_kwargs={"corpus": "tiny", "cache_dir": cache})
    try:
        trajs = runner.run(OraclePolicy(), [TaskSpec(seed=s, options={"task_index": s}) for s in range(4)])
    finally:
        runner.close()
    assert all(t.won for t in trajs)
    assert all(t.skill_context.startswith("# Searching") for t in trajs)
    assert all("num_hops" in t.metadata for t in trajs)
