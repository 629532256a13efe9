from __future__ import annotations

import json

import pytest

from agentgym_opsd.evaluation import evaluate_policy, make_policy
from agentgym_opsd.evaluation.runner import load_episode_records, plan_tasks
from agentgym_opsd.evaluation.suite import default_eval_split, expand_env_specs, normalize_env_spec
from agentgym_opsd.policies import OraclePolicy, PolicyOutput
from agentgym_opsd.registry import RegistryError


def test_oracle_scores_100_and_random_lower(toy_env_ids):
    oracle = evaluate_policy(make_policy("oracle"), "ToyCounter-v0:test", episodes=10, num_envs=4)
    random = evaluate_policy(make_policy("random", seed=1), "ToyCounter-v0:test", episodes=10, num_envs=4)
    assert oracle.success_rate == 1.0 and oracle.episodes == 10 and oracle.invalid_action_rate == 0.0
    assert random.success_rate < 0.7
    assert set(oracle.by_task_type) == {"up", "even"}
    assert sum(v["episodes"] for v in oracle.by_task_type.values()) == 10
    # the toy env reports optimal_plan_length: the oracle needs exactly that many turns
    assert all(t.num_turns == t.metadata["optimal_plan_length"] for t in oracle.trajectories)
    keys = oracle.metrics()
    assert keys["val/ToyCounter-v0:test/success_rate"] == 1.0 and "val/ToyCounter-v0:test/up/success_rate" in keys


def test_plan_covers_the_split_without_repeats_and_seeds_are_eval_range():
    tasks = plan_tasks(12, 10_000, 5)
    assert [t.seed for t in tasks] == list(range(10_000, 10_012))
    assert sorted(t.options["task_index"] for t in tasks[:5]) == [0, 1, 2, 3, 4]
    assert plan_tasks(3, 10_000, None)[2].options == {}
    assert plan_tasks(12, 10_000, 5) == tasks  # deterministic


def test_results_file_resumes(toy_env_ids, tmp_path):
    path = tmp_path / "episodes.jsonl"
    first = evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=3, num_envs=2, results_path=path,
                            policy_name="oracle")
    assert first.episodes_played == 3 and len(load_episode_records(path)) == 3
    more = evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=5, num_envs=2, results_path=path,
                           policy_name="oracle")
    assert more.episodes_played == 2 and more.episodes == 5 and more.success_rate == 1.0
    again = evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=5, num_envs=2, results_path=path,
                            policy_name="oracle")
    assert again.episodes_played == 0 and len(load_episode_records(path)) == 5
    # another policy name is another key; prompts are stripped from the stored records by default
    evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=1, results_path=path, policy_name="other")
    records = load_episode_records(path)
    assert len(records) == 6 and records[0].trajectory.turns[0].prompt == []
    # a half-written last line (a killed run) is skipped, and that episode is played again
    with path.open("a") as fh:
        fh.write('{"env_spec": "ToyCounter-v0:test", "policy": "or')
    assert len(load_episode_records(path)) == 6


class FlakyPolicy:
    """Answers with an error for the first `failures` requests it sees, then like the oracle."""

    spec = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.oracle = OraclePolicy()

    def act(self, requests):
        out = []
        for req in requests:
            if self.failures > 0:
                self.failures -= 1
                out.append(PolicyOutput("", error="endpoint timed out"))
            else:
                out.extend(self.oracle.act([req]))
        return out


def test_failed_episodes_are_retried_and_the_run_goes_on(toy_env_ids, tmp_path):
    path = tmp_path / "episodes.jsonl"
    transient = evaluate_policy(FlakyPolicy(failures=2), "ToyCounter-v0:test", episodes=4, num_envs=4,
                                results_path=path, max_retries=2)
    assert transient.success_rate == 1.0 and transient.failed_episodes == 0
    attempts = sorted(r.attempts for r in load_episode_records(path))
    assert attempts == [1, 1, 2, 2]
    hopeless = evaluate_policy(FlakyPolicy(failures=10**6), "ToyCounter-v0:test", episodes=3, num_envs=2,
                               max_retries=1)
    assert hopeless.episodes == 3 and hopeless.success_rate == 0.0 and hopeless.failed_episodes == 3
    assert hopeless.failure_reasons == ["policy failed: endpoint timed out (after 2 attempts)"]


def test_episodes_of_a_dead_endpoint_are_not_results_and_run_again_next_time(toy_env_ids, tmp_path):
    path = tmp_path / "episodes.jsonl"
    down = evaluate_policy(FlakyPolicy(failures=10**6), "ToyCounter-v0:test", episodes=4, num_envs=2,
                           results_path=path, max_retries=0)
    assert down.failed_episodes == 4 and down.episodes == 4 and load_episode_records(path) == []
    # half the endpoint comes back: the two episodes that run are kept, the other two are still pending
    half = evaluate_policy(FlakyPolicy(failures=2), "ToyCounter-v0:test", episodes=4, num_envs=2,
                           results_path=path, max_retries=0)
    assert half.episodes == 4 and half.failed_episodes == 2 and len(load_episode_records(path)) == 2
    back = evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=4, num_envs=2, results_path=path,
                           policy_name="flaky")
    assert back.episodes == 4 and back.failed_episodes == 0 and back.success_rate == 1.0
    assert back.episodes_played == 2  # only the episodes that had not run were played


def test_env_spec_errors_list_what_exists(toy_env_ids):
    with pytest.raises(RegistryError, match="registered: .*ToyCounter-v0"):
        normalize_env_spec("NoSuchEnv-v0:test")
    with pytest.raises(RegistryError, match="splits: train, test"):
        normalize_env_spec("ToyCounter-v0:nope")
    assert normalize_env_spec("agentgym_opsd/ToyCounter-v0") == "ToyCounter-v0:test"  # held-out split by default
    assert default_eval_split("ToyCounter-v0") == "test"
    specs = expand_env_specs(["ToyCounter-v0:train"], suite="default")
    assert specs[0] == "ToyCounter-v0:train" and "ToyCounter-v0:test" in specs and len(specs) == len(set(specs))
    with pytest.raises(ValueError, match="suites: default"):
        expand_env_specs([], suite="nope")


def test_summary_serialises(toy_env_ids):
    s = evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=2, num_envs=2)
    data = json.loads(json.dumps(s.to_dict()))
    assert data["success_rate"] == 1.0 and "trajectories" not in data
    with pytest.raises(ValueError, match="episodes"):
        evaluate_policy(OraclePolicy(), "ToyCounter-v0:test", episodes=0)


def test_invalid_actions_are_split_by_kind_in_summary_metrics_and_report(toy_env_ids):
    from agentgym_opsd.evaluation.reports import format_summary_table

    class NoTag:
        """Replies without any action tag: every turn is invalid of kind no_tag."""

        def act(self, requests):
            return [PolicyOutput("I am not sure.", finish_reason="eos") for _ in requests]

    summary = evaluate_policy(NoTag(), "ToyCounter-v0:test", episodes=2, num_envs=2)
    assert summary.invalid_action_rate == 1.0
    assert summary.invalid_by_kind == {"invalid/no_tag": 1.0, "invalid/not_admissible": 0.0,
                                       "invalid/truncated": 0.0}
    assert summary.metrics()["val/invalid/no_tag"] == 1.0
    assert summary.to_dict()["invalid_by_kind"]["invalid/no_tag"] == 1.0
    assert "| 100.0 / 0.0 / 0.0 |" in format_summary_table([summary])
