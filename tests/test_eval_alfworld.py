"""End to end on ALFWorld `easy`: the oracle scores 100%, a random policy clearly less, and the reports
carry ALFWorld's task types and optimal plan lengths."""

from __future__ import annotations

import importlib.util

import pytest

from agentgym_opsd.evaluation import evaluate_policy, make_policy
from agentgym_opsd.registry import registered_envs

pytestmark = pytest.mark.skipif(
    "agentgym_opsd/ALFWorld-v0" not in registered_envs() or importlib.util.find_spec("textworld") is None,
    reason="ALFWorld is not registered or textworld is missing",
)

EPISODES = 6


def test_oracle_is_perfect_and_random_clearly_lower_on_alfworld():
    oracle = evaluate_policy(make_policy("oracle"), "ALFWorld-v0:easy", episodes=EPISODES, num_envs=3)
    assert oracle.failed_episodes == 0, oracle.failure_reasons
    assert oracle.success_rate == 1.0 and oracle.invalid_action_rate == 0.0
    # the oracle follows an optimal plan: its turns are the plan length the env reports
    for traj in oracle.trajectories:
        assert traj.num_turns == traj.metadata["optimal_plan_length"]
    assert oracle.horizon["episodes_with_horizon"] == EPISODES
    random = evaluate_policy(make_policy("random", seed=0), "ALFWorld-v0:easy", episodes=EPISODES, num_envs=3,
                             max_turns=15)
    assert random.failed_episodes == 0, random.failure_reasons
    assert random.success_rate <= 0.5
    assert {t.task_id for t in random.trajectories} == {t.task_id for t in oracle.trajectories}  # same tasks
