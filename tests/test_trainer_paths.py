"""Trainer paths the other tests do not reach: the token-granularity estimator through the trainer,
validation during training, the released `success_source="reward"` prior (toy counter env, tiny random
model, torch backend: seconds on a CPU)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentgym_opsd.records import Trajectory
from agentgym_opsd.trainer.cli import main
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.validation import EPISODE_FIELDS

TOY = ["env.id=ToyCounter-v0", "trainer.backend=torch", "trainer.tensorboard=false"]


def make_trainer(tmp_path, *overrides: str) -> Trainer:
    return Trainer(load_config("cpu-tiny", [*TOY, f"trainer.output_dir={tmp_path}", *overrides]))


def _mixed_outcomes(trajs: list[Trajectory]) -> list[Trajectory]:
    """Real rollouts with outcomes set so every group has winners and losers (the tiny random model never
    wins by itself): advantages are then non-zero and the estimators have something to reshape."""
    for i, traj in enumerate(trajs):
        traj.won = i % 2 == 0
        traj.score = float(traj.won)
    return trajs


def _advantages_seen_by_update(trainer: Trainer, trajs: list[Trajectory]) -> tuple[dict, list[torch.Tensor]]:
    seen: list[torch.Tensor] = []
    update = trainer.update

    def spy(batch, logprobs, advantages):
        seen.extend(a.clone() for a in advantages.tokens)
        return update(batch, logprobs, advantages)

    trainer.update = spy  # type: ignore[method-assign]
    metrics, _ = trainer.step_on(trajs)
    return metrics, seen


@pytest.mark.parametrize("estimator", ["agentopsd", "agentopsd-token"])
def test_turn_and_token_estimators_through_the_trainer(tmp_path, toy_env_ids, estimator) -> None:
    trainer = make_trainer(tmp_path, f"algorithm.estimator={estimator}", "rollout.max_new_tokens=6")
    try:
        trajs = _mixed_outcomes(trainer.collect())
        metrics, advantages = _advantages_seen_by_update(trainer, trajs)
    finally:
        trainer.close()
    assert math.isfinite(metrics["loss"]) and metrics["teacher_rows"] == metrics["num_rows"] > 0
    assert metrics["evidence_std"] > 0  # the teacher (prompt with c+) disagrees with the student somewhere
    assert advantages and all(torch.isfinite(a).all() for a in advantages)
    varies_within_a_row = any(len(a) > 1 and float(a.max() - a.min()) > 1e-9 for a in advantages)
    # turn-level credit gives one value per turn; the token variant gives each token its own
    assert varies_within_a_row == (estimator == "agentopsd-token")


def test_validation_runs_during_training(tmp_path, toy_env_ids) -> None:
    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", *TOY, f"trainer.output_dir={out}", "trainer.total_steps=2",
                 "trainer.eval_every=1", "trainer.eval_episodes=2", "trainer.eval_at_start=true"]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    validated = [x["step"] for x in lines if "val/success_rate" in x]
    assert validated == [0, 1, 2]  # before training (step 0), then after every step
    for x in lines:  # one name per quantity, one key style per phase: <phase>/<env spec>/<metric>
        assert not [k for k in x if k.startswith(("time/", "env/")) or k == "loss/total"]
        if x["step"] > 0:
            assert x["train/ToyCounter-v0/success_rate"] == x["success_rate"] and "seconds_teacher" in x
        if "val/success_rate" in x:
            assert 0.0 <= x["val/success_rate"] <= 1.0 and math.isfinite(x["val/invalid_action_rate"])
    # each validation point keeps its held-out episodes, the same episodes every time, agreeing with its metrics
    files = sorted((out / "validation").glob("step_*.jsonl"))
    assert [f.name for f in files] == ["step_000000.jsonl", "step_000001.jsonl", "step_000002.jsonl"]
    episodes = [[json.loads(t) for t in f.read_text().splitlines()] for f in files]
    assert {len(e) for e in episodes} == {2}
    assert all(sorted(r["seed"] for r in e) == sorted(r["seed"] for r in episodes[0]) for e in episodes)
    for line, rows in zip([x for x in lines if "val/success_rate" in x], episodes, strict=True):
        assert set(rows[0]) == set(EPISODE_FIELDS)
        # each turn's action, and which the environment refused, agree with the episode's counts
        assert all(len(r["actions"]) == r["turns"] for r in rows)
        assert all(sum(not a["valid"] for a in r["actions"]) == r["invalid_actions"] for r in rows)
        assert all(isinstance(a["action"], str) for r in rows for a in r["actions"])
        assert line["val/success_rate"] == pytest.approx(sum(r["won"] for r in rows) / len(rows))


def test_reward_prior_is_the_group_mean_of_the_raw_reward(tmp_path, toy_env_ids) -> None:
    """success_source=reward with reward_scale=10 (released code): R̄ is the group mean raw reward, which the
    prior clips to 1 − ε0 as soon as one rollout won; success_source=won gives the win fraction."""
    rates = {}
    for source in ("won", "reward"):
        trainer = make_trainer(tmp_path / source, f"algorithm.success_source={source}", "env.reward_scale=10",
                               "rollout.max_new_tokens=4")
        try:
            trajs = _mixed_outcomes(trainer.collect())
            for traj in trajs:
                for turn in traj.turns:
                    turn.reward = 0.0
                traj.turns[-1].reward = 1.0 if traj.won else 0.0
            batch = trainer.score(trajs)
            rates[source] = sorted(set(batch.success_rate.tolist()))
            assert math.isfinite(trainer.step_on(trajs)[0]["loss"])
        finally:
            trainer.close()
    assert rates["won"] == [pytest.approx(0.5)]
    assert rates["reward"] == [pytest.approx(5.0)]  # 10 × one win in two: far outside [0, 1] before the clip


def test_the_warm_start_key_sees_a_template_text_and_nothing_without_one(tmp_path, toy_env_ids) -> None:
    from agentgym_opsd.trainer.warm_start import warm_start_key

    template = tmp_path / "t.txt"
    template.write_text("A {observation}")
    keys = []
    for extra in ([], [f"env.prompt_template={template}"]):
        trainer = make_trainer(tmp_path / str(len(keys)), *extra)
        try:
            settings = trainer.session.warm_starter.settings()
            keys.append(warm_start_key(settings))
        finally:
            trainer.close()
        assert "prompt_template" not in settings["env"]  # a path is not what shapes the prompts
    template.write_text("B {observation}")
    trainer = make_trainer(tmp_path / "2", f"env.prompt_template={template}")
    try:
        keys.append(warm_start_key(trainer.session.warm_starter.settings()))
    finally:
        trainer.close()
    assert len(set(keys)) == 3  # no template, template A, template B: three different warm starts


def test_the_warm_start_key_sees_the_demonstrator_version_and_not_the_outcome(tmp_path) -> None:
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.warm_start import WarmStart

    def key(*overrides: str, demonstrator: str = "") -> str | None:
        cfg = load_config("cpu-tiny", list(overrides))
        ws = WarmStart(cfg, run_dir=tmp_path, system_prompt="s", env_num_tasks=8, demonstrator=demonstrator)
        assert ("demonstrator" in ws.settings()) == bool(demonstrator)  # empty: keys from before the field match
        return str(ws.cache_dir())

    assert key() == key("env.outcome=score")  # the RL outcome does not shape the demonstrations
    assert key() != key(demonstrator="instruction-search") != key(demonstrator="v2")


@pytest.mark.parametrize("reward_setting", ["env.invalid_action_penalty=0.5", "env.reward_scale=10"])
def test_the_reward_make_up_reuses_the_cached_warm_start_and_its_start_evaluation(tmp_path, reward_setting) -> None:
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.validation import start_evaluation_key
    from agentgym_opsd.trainer.warm_start import WarmStart

    def keys(*overrides: str) -> tuple[str, str]:
        cfg = load_config("cpu-tiny", list(overrides))
        ws = WarmStart(cfg, run_dir=tmp_path, system_prompt="s", env_num_tasks=8)
        return str(ws.cache_dir()), start_evaluation_key(cfg, threads=1, world_size=1)

    # the penalty and the scale weigh the RL rewards; the demonstrations and the evaluation's episodes are the same
    assert keys(reward_setting) == keys()
    assert keys("env.max_turns=7") != keys()  # a setting that shapes the episodes still makes another entry


def test_the_warm_start_key_sees_the_action_history_only_when_it_is_on(tmp_path) -> None:
    from agentgym_opsd.trainer.config import load_config
    from agentgym_opsd.trainer.warm_start import WarmStart

    def settings(*overrides: str) -> dict:
        cfg = load_config("cpu-tiny", list(overrides))
        return WarmStart(cfg, run_dir=tmp_path, system_prompt="s", env_num_tasks=8).settings()

    assert "action_history" not in settings()["env"]  # off: keys cached before the field existed still match
    assert settings("env.action_history=true")["env"]["action_history"] is True
