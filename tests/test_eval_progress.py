"""Issue 68, item 4: an evaluation shows progress while its episodes play, not only as each batch of them ends
(a batch of 48 held-out episodes ran for minutes in silence before the trainer's validation said anything)."""

from __future__ import annotations


def test_an_evaluation_shows_its_turns_as_they_are_played(toy_env_ids, capsys) -> None:
    from agentgym_opsd.evaluation import evaluate_policy, make_policy

    evaluate_policy(make_policy("oracle"), "ToyCounter-v0", episodes=4, num_envs=4, progress=True)
    err = capsys.readouterr().err
    assert "rollout ToyCounter-v0" in err and "turn" in err  # the batch's turns, as they are played
    assert "eval ToyCounter-v0" in err  # and the episodes, as they end
    evaluate_policy(make_policy("oracle"), "ToyCounter-v0", episodes=2, progress=False)
    assert "rollout" not in capsys.readouterr().err
