"""`rollout.env_workers`: the same rollouts whether environments run in threads, worker processes or Ray
actors; a worker that is killed or hangs ends only its own environments' trajectories, flagged, and the pool
goes on with a fresh worker."""

from __future__ import annotations

import os
import signal

import pytest

from agentgym_opsd.envpool import EnvFactory, ProcessEnvPool, TaskSpec, make_env_pool
from agentgym_opsd.evaluation.runner import evaluate_policy
from agentgym_opsd.policies import OraclePolicy, PolicyOutput, RandomPolicy
from agentgym_opsd.rollout import RolloutRunner
from agentgym_opsd.trainer.config import ConfigError, load_config

TASKS = [TaskSpec(0, {"task_index": 1}), TaskSpec(1, {"task_index": 4}), TaskSpec(2, {"task_index": 2})]


def _play(env_workers: str, policy_fn, **options) -> list[dict]:
    runner = RolloutRunner("ToyCounter-v0", num_envs=6, env_workers=env_workers, **options)
    try:
        assert runner.pool.num_tasks == 5
        return [t.to_dict() for t in runner.run(policy_fn(), TASKS, group_size=2)]
    finally:
        runner.close()


@pytest.mark.parametrize("policy_fn", [OraclePolicy, lambda: RandomPolicy(seed=3)], ids=["oracle", "random"])
def test_processes_play_the_same_trajectories_as_threads(toy_env_ids, policy_fn):
    threads = _play("threads", policy_fn)
    assert _play("processes", policy_fn, num_env_workers=2) == threads
    assert any(t["won"] for t in threads)


class _KillWorkerAtTurn:
    """Answers `inc` everywhere; before answering turn `turn` it SIGKILLs worker 0 of the pool."""

    def __init__(self, runner: RolloutRunner, turn: int) -> None:
        self.runner, self.turn, self.calls = runner, turn, 0

    def act(self, requests):
        self.calls += 1
        if self.calls == self.turn:
            os.kill(self.runner.pool.worker_pids()[0], signal.SIGKILL)
        return [PolicyOutput(req.format_action("inc")) for req in requests]


def _kill_mid_episode(runner: RolloutRunner, died: str) -> None:
    # 4 environments on 2 workers: 0-1 on worker 0 (killed before turn 2), 2-3 on worker 1. Target 5: 5 turns.
    tasks = [TaskSpec(i, {"task_index": 4}) for i in range(4)]
    trajs = runner.run(_KillWorkerAtTurn(runner, turn=2), tasks)
    for lost in trajs[:2]:
        assert lost.error and "environment worker 0" in lost.error and died in lost.error, lost.error
        assert lost.truncated and not lost.won and lost.num_turns == 2
        assert lost.turns[0].action_valid and not lost.turns[1].action_valid
    for fine in trajs[2:]:
        assert fine.error is None and fine.won and fine.num_turns == 5
    assert runner.pool.replacements == 1
    # the next step of the pool: the fresh worker plays its environments again
    again = runner.run(OraclePolicy(), tasks)
    assert all(t.won and t.error is None for t in again)


def test_sigkilled_worker_flags_its_trajectories_and_the_pool_goes_on(toy_env_ids):
    runner = RolloutRunner("ToyCounter-v0", num_envs=4, env_workers="processes", num_env_workers=2)
    try:
        _kill_mid_episode(runner, died="SIGKILL")
    finally:
        runner.close()


@pytest.mark.parametrize("fail", ["raise", "hang"])
def test_env_failure_in_a_worker_is_flagged_like_in_a_thread(toy_env_ids, fail):
    runner = RolloutRunner("ToyFlaky-v0", num_envs=2, env_kwargs={"fail": fail}, step_timeout_s=1.0,
                           env_workers="processes", num_env_workers=2)
    try:
        bad, good = runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 0}), TaskSpec(1, {"task_index": 2})])
        expected = "environment raised during step: RuntimeError: engine crashed" if fail == "raise" else \
            "step timed out after 1.0s"
        assert bad.error == expected and bad.done and not bad.won
        assert good.won and good.error is None
        assert runner.pool.replacements == (fail == "hang")  # a hung worker is killed and replaced
        assert runner.run(OraclePolicy(), [TaskSpec(0, {"task_index": 2})])[0].won
    finally:
        runner.close()


def test_evaluation_runs_on_worker_processes(toy_env_ids):
    summary = evaluate_policy(OraclePolicy(), "ToyCounter-v0", episodes=5, num_envs=2, env_workers="processes")
    assert summary.success_rate == 1.0 and summary.failed_episodes == 0


def test_pool_size_and_usage_errors(toy_env_ids):
    with ProcessEnvPool(EnvFactory.for_spec("ToyCounter-v0"), 3, num_workers=8) as pool:
        assert pool.num_workers == 3 and pool.hosted == [[0], [1], [2]]  # never more workers than environments
        with pytest.raises(ValueError, match="pool size"):
            pool.reset([TaskSpec(0), TaskSpec(1)], group_size=2)
        pool.reset([TaskSpec(0)])
        with pytest.raises(ValueError, match="not active"):
            pool.step({1: "inc"})


def test_bad_env_workers_value_names_the_key(toy_env_ids):
    with pytest.raises(ConfigError, match=r"rollout\.env_workers.*threads, processes, ray.*'fork'"):
        load_config("cpu-tiny", ["rollout.env_workers=fork"])
    with pytest.raises(ValueError, match="env_workers must be one of threads, processes, ray; got 'fork'"):
        make_env_pool("fork", EnvFactory.for_spec("ToyCounter-v0"), 2)


def test_ray_actors_play_the_same_trajectories_and_survive_a_kill(toy_env_ids):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, configure_logging=False)
    try:
        assert _play("ray", OraclePolicy, num_env_workers=2) == _play("threads", OraclePolicy)
        runner = RolloutRunner("ToyCounter-v0", num_envs=4, env_workers="ray", num_env_workers=2,
                               step_timeout_s=60.0)
        try:
            _kill_mid_episode(runner, died="died")
        finally:
            runner.close()
    finally:
        ray.shutdown()
