"""Dynamic sampling (filter-groups): exactly `tasks_per_step` informative groups when they exist, a hard cap on
rounds, the fallback when none exists, and the trainer's step with it on (toy env, tiny model)."""

from __future__ import annotations

import json
from unittest import mock

import pytest

from agentgym_opsd.records import Trajectory, Turn
from agentgym_opsd.trainer.config import ConfigError, load_config
from agentgym_opsd.trainer.dynamic_sampling import collect_informative, group_diversity, is_informative


def _traj(group: int, won: bool, logprobs=(-0.5, -1.5)) -> Trajectory:
    turn = Turn(index=0, prompt=[], response_text="x", action="go", action_valid=True, observation="", reward=0.0,
                response_token_ids=[1] * len(logprobs), response_logprobs=list(logprobs))
    return Trajectory(env_id="toy", task_id="t", task_type="", group_id=group, traj_id=0, seed=0, won=won,
                      turns=[turn])


def _rounds(outcomes_per_round: list[list[list[bool]]]):
    """play_round(i) -> the trajectories of round i: one group per list of outcomes, group ids unique."""
    calls: list[int] = []

    def play(i: int) -> list[Trajectory]:
        calls.append(i)
        return [_traj(100 * i + g, won) for g, group in enumerate(outcomes_per_round[i]) for won in group]

    return play, calls


def test_informative_means_both_outcomes_among_rollouts_that_ran() -> None:
    assert is_informative([_traj(0, True), _traj(0, False)])
    assert not is_informative([_traj(0, True), _traj(0, True)])
    broken = _traj(0, False)
    broken.error = "env crashed"
    assert not is_informative([_traj(0, True), broken])


def test_keeps_exactly_the_wanted_groups_when_they_exist() -> None:
    play, calls = _rounds([
        [[True, True], [False, True]],            # 1 informative of 2
        [[False, False], [True, False]],          # 1 more: 2 wanted, done
        [[True, False], [True, False]],           # never played
    ])
    trajs, report = collect_informative(play, want_groups=2, max_rounds=3)
    assert calls == [0, 1]
    assert sorted({t.group_id for t in trajs}) == [1, 101]
    assert report.rounds == 2 and report.kept_groups == 2 and report.dropped_groups == 2
    assert report.metrics()["sampling/mixed_group_share"] == pytest.approx(0.5)


def test_a_rich_round_keeps_no_more_than_wanted() -> None:
    play, calls = _rounds([[[True, False]] * 5])
    trajs, report = collect_informative(play, want_groups=2, max_rounds=4)
    assert calls == [0] and report.kept_groups == 2 and len({t.group_id for t in trajs}) == 2
    assert report.dropped_groups == 3 and report.informative_groups == 5


def test_stops_at_the_cap_with_what_it_found() -> None:
    play, calls = _rounds([[[True, True], [False, False]], [[True, False], [True, True]], [[False, False]] * 2,
                           [[True, False]] * 2])
    trajs, report = collect_informative(play, want_groups=2, max_rounds=3)
    assert calls == [0, 1, 2]  # the fourth round would have had them: the cap wins
    assert {t.group_id for t in trajs} == {100} and report.kept_groups == 1 and not report.fallback


def test_no_informative_group_within_the_cap_keeps_the_last_round() -> None:
    play, calls = _rounds([[[True, True]], [[False, False]]])
    trajs, report = collect_informative(play, want_groups=1, max_rounds=2)
    assert calls == [0, 1] and report.fallback
    assert {t.group_id for t in trajs} == {100} and report.kept_groups == 1 and report.dropped_groups == 1


def test_keep_going_decides_after_the_first_round() -> None:
    play, calls = _rounds([[[True, False]], [[True, False]], [[True, False]]])
    # another rank still needs groups: this rank plays on (and keeps no more than it wants)
    trajs, report = collect_informative(play, want_groups=1, max_rounds=3, keep_going=lambda kept: len(calls) < 2)
    assert calls == [0, 1] and report.kept_groups == 1 and {t.group_id for t in trajs} == {0}


def test_group_diversity() -> None:
    trajs = [_traj(0, True), _traj(0, False), _traj(1, True), _traj(1, True, logprobs=(-2.0,))]
    d = group_diversity(trajs, prefix="pool/")
    assert d["pool/mixed_group_share"] == 0.5
    assert d["pool/sampled_nll_per_token"] == pytest.approx((2.0 * 3 + 2.0) / 7)


def test_config_checks_the_cap() -> None:
    with pytest.raises(ConfigError, match="rollout.max_sampling_rounds"):
        load_config("cpu-tiny", ["rollout.max_sampling_rounds=0"])


@pytest.mark.parametrize("outcome", ["won", "score"])
def test_trainer_step_with_dynamic_sampling_logs_its_rounds(tmp_path, toy_env_ids, outcome) -> None:
    from agentgym_opsd.trainer.loop import Trainer

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   f"env.outcome={outcome}",
                                   "trainer.tensorboard=false", "rollout.dynamic_sampling=true",
                                   "rollout.max_sampling_rounds=2", "algorithm.penalty_mode=outcome",
                                   "trainer.total_steps=1", "trainer.eval_at_start=false", "trainer.eval_every=0"])
    trainer = Trainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert 1 <= line["sampling/rounds"] <= 2
    assert line["sampling/kept_groups"] + line["sampling/dropped_groups"] == line["sampling/groups_seen"]
    assert line["sampling/kept_groups"] <= cfg.rollout.tasks_per_step
    # the task stream moved on by one round of tasks per round played
    assert trainer.task_cursor == line["sampling/rounds"] * cfg.rollout.tasks_per_step
    assert "rollout/sampled_nll_per_token" in line


def test_pool_diversity_counts_one_group_per_game(tmp_path, toy_env_ids, monkeypatch) -> None:
    from agentgym_opsd.trainer import validation
    from agentgym_opsd.trainer.loop import Trainer

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "env.num_train_tasks=4", "trainer.eval_pool_rollouts=2"])
    trainer = Trainer(cfg)
    seen: list[Trajectory] = []
    real = validation.group_diversity
    monkeypatch.setattr(validation, "group_diversity", lambda trajs, **kw: (seen.extend(trajs), real(trajs, **kw))[1])
    try:
        out = trainer.session.validation.pool(trainer.session.policy)
    finally:
        trainer.close()
    # the pool is played a few games per call: every game must still be its own group (4 groups of 2)
    assert sorted({t.group_id for t in seen}) == [0, 1, 2, 3] and len(seen) == 8
    assert out["pool/episodes"] == 8


@pytest.mark.parametrize("batch", [2, 4, 32])
def test_pool_check_plays_eval_batch_episodes_side_by_side(tmp_path, toy_env_ids, batch) -> None:
    """Whatever the batch, every game is played `eval_pool_rollouts` times as its own group; a batch larger
    than the training pool gets a runner of its own."""
    from agentgym_opsd.trainer.loop import Trainer

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "env.num_train_tasks=6", "trainer.eval_pool_rollouts=2",
                                   f"trainer.eval_batch_episodes={batch}"])
    trainer = Trainer(cfg)
    validation = trainer.session.validation
    calls: list[int] = []
    try:
        train_runner = validation.train_runners["ToyCounter-v0"]
        real_run = type(train_runner).run

        def counting_run(runner, policy, tasks, **kw):
            calls.append(len(tasks) * kw["group_size"])
            return real_run(runner, policy, tasks, **kw)

        type(train_runner).run = counting_run
        try:
            out = validation.pool(trainer.session.policy)
        finally:
            type(train_runner).run = real_run
    finally:
        trainer.close()
    assert out["pool/episodes"] == 12 and sum(calls) == 12
    assert max(calls) == min(max(batch // 2, 1) * 2, 12)  # whole games, up to the batch


@pytest.mark.parametrize(("rollout_batch", "eval_batch", "chunk", "most_rows"), [(2, 6, 6, 6), (4, 2, 4, 2)])
def test_validation_generates_the_turns_of_its_side_by_side_episodes_in_one_batch(
        tmp_path, toy_env_ids, rollout_batch, eval_batch, chunk, most_rows) -> None:
    """`eval_batch_episodes` episodes are played side by side and their turns generated together, in chunks of
    that size (never smaller than `rollout.batch_size`); the rollout policy keeps its own chunk size."""
    from agentgym_opsd.models.hf_policy import HFPolicy
    from agentgym_opsd.trainer.loop import Trainer

    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", "env.num_train_tasks=6", "trainer.eval_pool_rollouts=2",
                                   "trainer.eval_episodes=6", f"trainer.eval_batch_episodes={eval_batch}",
                                   f"rollout.batch_size={rollout_batch}"])
    trainer = Trainer(cfg)
    chunks: list[int] = []
    real = HFPolicy._generate_chunk
    try:
        sampler = trainer.session.sampler_at(0.4, 7)
        assert sampler.batch_size == chunk and trainer.session.policy.batch_size == rollout_batch
        with mock.patch.object(HFPolicy, "_generate_chunk",
                               lambda self, prompts: (chunks.append(len(prompts)), real(self, prompts))[1]):
            out = trainer.session.validation.run(trainer.session.sampler_at)
    finally:
        trainer.close()
    assert out["val/episodes"] == 6 and out["pool/episodes"] == 12
    assert max(chunks) == most_rows
