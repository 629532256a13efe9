from __future__ import annotations

import pytest

from agentgym_opsd.envpool import EnvPool, TaskSpec
from agentgym_opsd.policies import OraclePolicy, PolicyOutput, RandomPolicy
from agentgym_opsd.prompts import SKILL_HEADER
from agentgym_opsd.registry import make
from agentgym_opsd.rollout import RolloutRunner


def test_oracle_wins_every_task_and_groups_share_seeds(toy_env_ids):
    runner = RolloutRunner("ToyCounter-v0", num_envs=6)
    trajs = runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 1}), TaskSpec(1, {"task_index": 2}),
                                         TaskSpec(2, {"task_index": 4})], group_size=2)
    assert [t.group_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert all(t.won and t.terminated for t in trajs)
    assert [t.num_turns for t in trajs] == [2, 2, 3, 3, 5, 5]
    assert trajs[0].metadata["optimal_plan_length"] == 2
    # c+ comes from the toy skill library; the student prompt never contains it, the teacher prompt does.
    t = trajs[0]
    assert "Count carefully" in t.skill_context
    assert SKILL_HEADER not in t.turns[0].prompt[0]["content"]
    assert t.skill_context in runner.teacher_messages(t, t.turns[0])[0]["content"]
    runner.close()


class GarbagePolicy:
    def act(self, requests):
        return [PolicyOutput("I refuse to use tags \x00 " + "x" * 10_000) for _ in requests]


def test_unparseable_text_is_an_invalid_action_not_a_crash(toy_env_ids):
    runner = RolloutRunner("ToyCounter-v0", num_envs=1)
    (traj,) = runner.run(GarbagePolicy(), [TaskSpec(0, {"task_index": 0})])
    assert traj.truncated and not traj.won and traj.num_turns == 10
    assert all(not t.action_valid and t.invalid_reason for t in traj.turns)
    assert traj.turns[0].observation == "Nothing happens."


def test_random_policy_is_worse_than_oracle(toy_env_ids):
    runner = RolloutRunner("ToyCounter-v0", num_envs=8)
    tasks = [TaskSpec(i, {"task_index": 4}) for i in range(8)]
    random_wins = sum(t.won for t in runner.run(RandomPolicy(seed=0), tasks))
    oracle_wins = sum(t.won for t in runner.run(OraclePolicy(), tasks))
    assert oracle_wins == 8 and random_wins < 8


@pytest.mark.parametrize("fail", ["raise", "hang"])
def test_env_failure_becomes_flagged_trajectory(toy_env_ids, fail):
    runner = RolloutRunner("ToyFlaky-v0", num_envs=2, env_kwargs={"fail": fail}, step_timeout_s=1.0)
    bad, good = runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 0}), TaskSpec(1, {"task_index": 2})])
    assert bad.error and ("RuntimeError" in bad.error or "timed out" in bad.error)
    assert bad.done and not bad.won
    assert good.won and good.error is None
    # the failed instance is replaced: the pool plays again
    again = runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 2})])
    assert again[0].won


def test_pool_rejects_bad_usage(toy_env_ids):
    pool = EnvPool(lambda: make("ToyCounter-v0"), 2)
    with pytest.raises(ValueError, match="pool size"):
        pool.reset([TaskSpec(0), TaskSpec(1)], group_size=2)
    pool.reset([TaskSpec(0)], group_size=1)
    with pytest.raises(ValueError, match="not active"):
        pool.step({1: "inc"})
    pool.close()


def test_actions_after_end_and_seeded_determinism(toy_env_ids):
    env = make("ToyCounter-v0")
    o1, i1 = env.reset(seed=7)
    o2, i2 = env.reset(seed=7)
    assert (o1, i1["task_id"]) == (o2, i2["task_id"])
    env.reset(options={"task_index": 0})
    _, r, term, trunc, info = env.step("inc")
    assert term and info["won"] and r == 1.0
    obs, r, term, _, info = env.step("inc")
    assert term and not info["action_valid"] and r == 0.0 and "ended" in obs
