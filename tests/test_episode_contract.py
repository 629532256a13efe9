"""One episode contract (issue 66, item 4): an episode that ended with an error is a failure everywhere (the
success count, the reward, the credit's prior R̄, the TRL reward fields), and every path charges the invalid-action
penalty through `turns`, honouring `penalize`."""

from __future__ import annotations

import pytest

from agentgym_opsd.integrations.openenv_env import SessionSettings
from agentgym_opsd.records import Trajectory, Turn, summarize
from agentgym_opsd.registry import env_profile
from agentgym_opsd.trainer.turn_batch import build_turn_batch, group_success_rates, trajectory_rewards
from agentgym_opsd.turns import num_penalised


def _turn(index: int, kind: str | None) -> Turn:
    return Turn(index=index, prompt=[{"role": "user", "content": "go"}], response_text="x", action="" if kind else "a",
                action_valid=kind is None, observation="o", reward=0.0, response_token_ids=[1, 2],
                response_logprobs=[-0.1, -0.2], info={"invalid_kind": kind} if kind else {})


def _episode(traj_id: int, *, won: bool, error: str | None = None, kinds: tuple[str | None, ...] = (None,)) -> Trajectory:
    return Trajectory(env_id="ALFWorld-v0", task_id=f"t{traj_id}", task_type="pick", group_id=0, traj_id=traj_id,
                      seed=0, turns=[_turn(i, k) for i, k in enumerate(kinds)], won=won, score=1.0 if won else 0.0,
                      error=error)


def test_an_errored_won_episode_is_a_failure_in_the_reward_and_the_prior() -> None:
    errored = _episode(0, won=True, error="step timed out")
    clean = _episode(1, won=True)
    assert errored.outcome("won") == 0.0 and errored.outcome("score") == 0.0 and clean.outcome("won") == 1.0
    assert summarize([errored, clean]).success_rate == pytest.approx(0.5)
    rewards = trajectory_rewards([errored, clean], reward_scale=10.0, invalid_penalty=0.0)
    assert rewards.tolist() == [0.0, 10.0]
    assert group_success_rates([errored, clean]) == {0: pytest.approx(0.5)}
    batch = build_turn_batch([errored, clean], encode_prompt=lambda messages: [5],
                             reward_scale=10.0)
    assert batch.traj_rewards.tolist() == [0.0, 10.0]
    assert batch.success_rate.tolist() == [0.5, 0.5]  # the prior R̄ of both rows


def test_the_trl_rollout_fields_honour_penalize_and_the_error_rule() -> None:
    from agentgym_opsd.integrations.trl import episode_fields

    played = _episode(0, won=True, kinds=("no_tag", "not_admissible", None))
    errored = _episode(1, won=True, error="the environment crashed", kinds=(None,))
    assert episode_fields([played, errored], 0.1, "any")["invalid_penalty"] == pytest.approx([0.2, 0.0])
    fields = episode_fields([played, errored], 0.1, "format")
    assert fields["invalid_penalty"] == pytest.approx([0.1, 0.0])  # a refused action goes unpunished
    assert fields["won"] == [1.0, 0.0] and fields["score"] == [1.0, 0.0]


def test_the_trl_tool_env_records_turns_as_our_rollout_does(tmp_path) -> None:
    """A well-formed action the environment refuses: recorded with its invalid kind and the environment's own
    reward (no penalty baked in), so `penalize="format"` charges nothing for it and "any" charges it once."""
    from agentgym_opsd.integrations.trl_tools import AgentGymToolEnvFactory

    env = AgentGymToolEnvFactory("ALFWorld-v0:easy", record_path=tmp_path / "e.jsonl")()
    env.reset(task='{"seed": 3, "options": {}}')
    env.act("fly to the moon")
    (turn,) = env.trajectory.turns
    assert turn.invalid_kind == "not_admissible" and turn.reward == 0.0 and not turn.action_valid
    assert num_penalised(env.trajectory.turns, "format") == 0 and num_penalised(env.trajectory.turns, "any") == 1
    assert env.trajectory.total_reward == 0.0


@pytest.mark.parametrize("make", [
    lambda: SessionSettings("ALFWorld-v0:easy", penalize="most"),
    lambda: build_turn_batch([], encode_prompt=lambda m: [1], penalize="most"),
    lambda: __import__("agentgym_opsd.integrations.trl", fromlist=["AgentGymRollout"]).AgentGymRollout(
        "ALFWorld-v0:easy", penalize="most"),
], ids=["session", "turn-batch", "trl-rollout"])
def test_penalize_is_checked_by_one_rule_everywhere(make) -> None:
    with pytest.raises(ValueError, match=r"penalize must be one of \['any', 'format'\], got 'most'"):
        make()
    assert env_profile("ALFWorld-v0").invalid_action_penalty > 0
