"""The released update recipe: PPO mini-batches, dual clip, per-turn invalid-action penalty with cross-step
group statistics, rows for empty replies, the LoRA reference, λ warm-down, layer freezing and the cached,
epoch-based warm start (toy counter env, tiny random model, torch backend: seconds on a CPU)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd import credit
from agentgym_opsd.models.loading import freeze_lower_layers, load_policy_model
from agentgym_opsd.records import Trajectory, Turn, classify_invalid, invalid_rates
from agentgym_opsd.trainer.config import load_config
from agentgym_opsd.trainer.logprobs import batched_response_logprobs
from agentgym_opsd.trainer.loop import Trainer
from agentgym_opsd.trainer.losses import clipped_policy_loss, row_loss_weights
from agentgym_opsd.trainer.turn_batch import (
    BatchAdvantages,
    PolicyLogProbs,
    TeacherEvidence,
    build_turn_batch,
)
from agentgym_opsd.trainer.warm_start import sft_schedule


def make_trainer(tmp_path, *overrides: str) -> Trainer:
    cfg = load_config("cpu-tiny", ["env.id=ToyCounter-v0", f"trainer.output_dir={tmp_path}", "trainer.backend=torch",
                                   "trainer.tensorboard=false", *overrides])
    return Trainer(cfg)


# ---- PPO mini-batches and the dual clip -----------------------------------------------------------------


@pytest.mark.parametrize(("mini", "epochs"), [(0, 1), (3, 1), (4, 2), (1000, 3)])
def test_optimizer_steps_are_ceil_rows_over_mini_batch_times_epochs(tmp_path, toy_env_ids, mini, epochs) -> None:
    trainer = make_trainer(tmp_path, f"algorithm.ppo_mini_batch_rows={mini}", f"algorithm.ppo_epochs={epochs}")
    try:
        calls = []
        step = trainer.session.trained.engine.step
        trainer.session.trained.engine.step = lambda: calls.append(1) or step()
        trajs = trainer.collect()
        metrics, _ = trainer.step_on(trajs)
        rows = int(metrics["num_rows"])
        expected = math.ceil(rows / (mini or rows)) * epochs
        assert len(calls) == metrics["optimizer_steps"] == expected
    finally:
        trainer.close()


def test_mini_batches_cover_every_row_once_per_epoch_in_a_seeded_shuffle(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, "algorithm.ppo_mini_batch_rows=4", "algorithm.ppo_epochs=2")
    try:
        batches = trainer.updater.mini_batches(10, step=trainer.step_done)
        assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
        assert sorted(sum(batches[:3], [])) == sorted(sum(batches[3:], [])) == list(range(10))
        assert batches[:3] != batches[3:]  # each epoch reshuffles
        assert trainer.updater.mini_batches(10, step=trainer.step_done) == batches  # the same step replays the same order (resume)
    finally:
        trainer.close()


def test_after_the_first_mini_batch_the_ratio_moves_and_clipping_acts(tmp_path, toy_env_ids) -> None:
    # A constructed batch: real rows with advantages of ±1, one row per optimiser step and a large learning
    # rate. The later mini-batches are evaluated by a policy that already moved away from pi_old, so the
    # ratio is no longer 1 and the clip has work to do.
    trainer = make_trainer(tmp_path, "algorithm.ppo_mini_batch_rows=1", "optim.lr=0.05", "algorithm.ppo_epochs=2")
    try:
        batch = trainer.score(trainer.collect())
        old = [torch.tensor(r.sample_logprobs) for r in batch.rows]
        adv = [torch.full((len(r.response_ids),), 1.0 if i % 2 else -1.0) for i, r in enumerate(batch.rows)]
        metrics = trainer.update(batch, PolicyLogProbs(old), BatchAdvantages(adv, torch.zeros(0), torch.zeros(0), None))
        assert metrics["optimizer_steps"] == 2 * len(batch.rows)
        assert abs(metrics["approx_kl"]) > 1e-4
        assert metrics["clip_fraction"] > 0
    finally:
        trainer.close()


def test_one_mini_batch_keeps_the_ratio_at_one(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, "algorithm.ppo_mini_batch_rows=0", "optim.lr=0.05")
    try:
        metrics, _ = trainer.step_on(trainer.collect())
        assert metrics["optimizer_steps"] == 1
        assert abs(metrics["approx_kl"]) < 1e-5 and metrics["clip_fraction"] == 0
    finally:
        trainer.close()


def _loss(ratio: float, adv: float, c: float) -> tuple[float, int]:
    logp = torch.tensor([[math.log(ratio)]])
    total, clipped = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1),
                                         clip_low=0.2, clip_high=0.24, clip_ratio_c=c)
    return float(total), int(clipped)


def test_dual_clip_by_hand() -> None:
    # A < 0 with a ratio far above 1: PPO's loss is r·|A| = 5; the dual clip caps it at c·|A| = 3.
    assert _loss(5.0, -1.0, 0.0) == pytest.approx((5.0, 0))
    assert _loss(5.0, -1.0, 3.0) == pytest.approx((3.0, 1))
    assert _loss(2.0, -1.0, 3.0) == pytest.approx((2.0, 0))  # under the cap: plain PPO
    # A > 0: the dual clip never acts; the upper clip does (−1.24·A).
    assert _loss(5.0, 2.0, 3.0) == pytest.approx((-2.48, 1))
    # A < 0 with the ratio below 1 − ε: the lower clip picks −(0.8)·A = 0.8.
    assert _loss(0.5, -1.0, 3.0) == pytest.approx((0.8, 1))


@settings(max_examples=200, deadline=None)
@given(st.floats(-4, 4), st.floats(-5, 5), st.floats(1.01, 10))
def test_dual_clip_bounds_the_loss_of_negative_advantages(log_ratio: float, adv: float, c: float) -> None:
    ratio = math.exp(log_ratio)
    plain, _ = _loss(ratio, adv, 0.0)
    dual, _ = _loss(ratio, adv, c)
    if adv < 0:
        cap = float(-c * torch.tensor(adv))  # the cap in the loss's own float32 arithmetic
        assert dual <= cap + 1e-6 and dual <= plain + 1e-6
    else:
        assert dual == pytest.approx(plain)


# ---- invalid actions: kinds, the per-turn penalty, cross-step statistics ---------------------------------


def test_invalid_kinds() -> None:
    assert classify_invalid(parsed=True, accepted=True, finish_reason="stop") is None
    assert classify_invalid(parsed=True, accepted=False, finish_reason="stop") == "not_admissible"
    assert classify_invalid(parsed=False, accepted=False, finish_reason="eos") == "no_tag"
    assert classify_invalid(parsed=False, accepted=False, finish_reason="length") == "truncated"


def _turn(i: int, kind: str | None, tokens=(5, 6)) -> Turn:
    info = {"invalid_kind": kind} if kind else {}
    return Turn(index=i, prompt=[{"role": "user", "content": f"turn {i}"}], response_text="x",
                action="" if kind in ("no_tag", "truncated") else "go", action_valid=kind is None, observation="",
                reward=0.0, response_token_ids=list(tokens), response_logprobs=[-1.0] * len(tokens), info=info)


def _traj(traj_id: int, won: bool, kinds: list[str | None], group: int = 0) -> Trajectory:
    return Trajectory(env_id="toy", task_id="t", task_type="", group_id=group, traj_id=traj_id, seed=0, won=won,
                      turns=[_turn(i, k) for i, k in enumerate(kinds)])


def _encode(messages) -> list[int]:
    return [1, 2, 3]


def test_invalid_rates_split_the_invalid_action_rate() -> None:
    trajs = [_traj(0, True, [None, "no_tag", "not_admissible"]), _traj(1, False, ["truncated", None])]
    rates = invalid_rates(trajs)
    assert rates == pytest.approx({"invalid/no_tag": 0.2, "invalid/not_admissible": 0.2, "invalid/truncated": 0.2})
    batch = build_turn_batch(trajs, encode_prompt=_encode)
    assert sum(rates.values()) == pytest.approx(batch.stats["invalid_action_rate"])


def test_trajectory_penalty_by_hand() -> None:
    trajs = [_traj(0, True, [None, "no_tag"]), _traj(1, False, ["not_admissible"])]
    batch = build_turn_batch(trajs, encode_prompt=_encode, invalid_penalty=0.1)
    assert batch.traj_rewards.tolist() == pytest.approx([0.9, -0.1])
    assert batch.row_penalties.tolist() == [0.0, 0.0, 0.0]
    fmt = build_turn_batch(trajs, encode_prompt=_encode, invalid_penalty=0.1, penalize="format")
    assert fmt.traj_rewards.tolist() == pytest.approx([0.9, 0.0])  # a refused but well-formed action is free


def test_turn_penalty_and_cross_step_statistics_by_hand() -> None:
    # Group 0: trajectory 0 won in two turns, the second one invalid; trajectory 1 lost in one valid turn.
    trajs = [_traj(0, True, [None, "no_tag"]), _traj(1, False, [None])]
    batch = build_turn_batch(trajs, encode_prompt=_encode, invalid_penalty=0.1,
                             penalty_mode="turn")
    assert batch.traj_rewards.tolist() == [1.0, 0.0]
    assert batch.row_penalties.tolist() == [0.0, 0.1, 0.0]
    eps = 1e-6
    # cross steps: row scores 1.0, 0.9, 0.0 -> mean 0.6333.., unbiased std over the three rows
    scores = np.array([1.0, 0.9, 0.0])
    mean, std = scores.mean(), scores.std(ddof=1)
    seq, pen = credit.grpo_turn_penalty_advantages(batch.traj_rewards, batch.traj_group_ids, batch.traj_index,
                                                   batch.row_penalties, cross_steps=True, eps=eps)
    assert seq.tolist() == pytest.approx([(1 - mean) / (std + eps), (0 - mean) / (std + eps)])
    assert pen.tolist() == pytest.approx([0.0, -0.1 / (std + eps), 0.0])
    row = seq[batch.traj_index] + pen
    assert row.tolist() == pytest.approx(((scores - mean) / (std + eps)).tolist())  # verl's row advantage
    # one score per trajectory: mean 0.5, std 0.7071 over the rewards 1 and 0
    seq, pen = credit.grpo_turn_penalty_advantages(batch.traj_rewards, batch.traj_group_ids, batch.traj_index,
                                                   batch.row_penalties, cross_steps=False, eps=eps)
    s = math.sqrt(0.5)
    assert seq.tolist() == pytest.approx([0.5 / (s + eps), -0.5 / (s + eps)])
    assert pen.tolist() == pytest.approx([0.0, -0.1 / (s + eps), 0.0])


def test_turn_penalty_without_any_signal_is_zero() -> None:
    trajs = [_traj(0, True, [None]), _traj(1, True, [None])]
    batch = build_turn_batch(trajs, encode_prompt=_encode, penalty_mode="turn",
                             invalid_penalty=0.1)
    seq, pen = credit.grpo_turn_penalty_advantages(batch.traj_rewards, batch.traj_group_ids, batch.traj_index,
                                                   batch.row_penalties)
    assert seq.abs().max() == 0 and pen.abs().max() == 0


def test_trainer_adds_the_row_penalty_after_the_reshaping(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, "algorithm.penalty_mode=turn", "algorithm.grpo_cross_steps=true",
                           "algorithm.estimator=grpo")
    try:
        trajs = [_traj(0, True, [None, "no_tag"]), _traj(1, False, [None])]
        batch = build_turn_batch(trajs, encode_prompt=_encode, invalid_penalty=0.1,
                                 penalty_mode="turn")
        adv = trainer.credit(batch, TeacherEvidence.none([torch.zeros(2)] * 3)).tokens
        scores = np.array([1.0, 0.9, 0.0])
        expected = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
        assert [float(a[0]) for a in adv] == pytest.approx(expected.tolist(), abs=1e-6)
    finally:
        trainer.close()


def test_an_empty_reply_is_a_trainable_row() -> None:
    # The HF sampler keeps the end-of-sequence token of an empty reply (tests/test_generation_hf.py), so the
    # turn has one token and becomes a row the gradient can push down.
    traj = _traj(0, False, ["no_tag"])
    traj.turns[0].response_text = ""
    traj.turns[0].response_token_ids = [2]
    traj.turns[0].response_logprobs = [-0.1]
    batch = build_turn_batch([traj], encode_prompt=_encode)
    assert len(batch.rows) == 1 and batch.rows[0].response_ids == [2]


# ---- λ warm-down ---------------------------------------------------------------------------------------


def test_lam_warmdown(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, "algorithm.lam=0.5", "algorithm.lam_warmdown_steps=2", "trainer.total_steps=4")
    try:
        lams = []
        for step in range(4):
            trainer.step_done = step
            lams.append(trainer.current_lam())
        assert lams == pytest.approx([0.5, 0.5, 0.25, 0.0])
    finally:
        trainer.close()


# ---- layer freezing --------------------------------------------------------------------------------------


def test_freeze_lower_layers_trains_only_the_top(toy_env_ids) -> None:
    model, _ = load_policy_model("tiny-random", trainable=True)
    layers = model.model.layers
    freeze_lower_layers(model, 1)
    assert all(p.requires_grad for p in layers[-1].parameters())
    assert not any(p.requires_grad for layer in layers[:-1] for p in layer.parameters())
    assert not model.get_input_embeddings().weight.requires_grad
    assert all(p.requires_grad for p in model.model.norm.parameters())
    with pytest.raises(ValueError, match="trainable_layers"):
        freeze_lower_layers(model, len(layers) + 1)


# ---- warm start: epochs, cache, LoRA reference -----------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(1, 9), st.integers(1, 3))
def test_sft_schedule_visits_every_row_once_per_epoch(rows: int, batch: int, epochs: int) -> None:
    schedule = sft_schedule(rows, batch_rows=batch, epochs=epochs, rng=np.random.default_rng(0))
    seen = np.concatenate(schedule)
    assert np.bincount(seen, minlength=rows).tolist() == [epochs] * rows
    assert all(len(b) <= batch for b in schedule)


WARM = ["warm_start.epochs=2", "warm_start.episodes=6", "warm_start.heldout_episodes=2", "warm_start.batch_rows=4",
        "warm_start.lr=1e-3", "trainer.total_steps=0"]


def test_second_run_reuses_the_warm_start_cache(tmp_path, toy_env_ids, monkeypatch) -> None:
    from agentgym_opsd.trainer import warm_start

    monkeypatch.setenv("AGENTGYM_OPSD_CACHE", str(tmp_path / "cache"))
    layouts: list[bool] = []
    step = warm_start.sft_step
    monkeypatch.setattr(warm_start, "sft_step", lambda *a, **kw: layouts.append(kw["packed"]) or step(*a, **kw))
    first = make_trainer(tmp_path / "a", *WARM)
    try:
        s1 = first.warm_start()
        assert layouts and all(layouts)  # a llama-family model: the SFT packs its micro-batches
        weights = {k: v.clone() for k, v in first.session.trained.model.state_dict().items()}
    finally:
        first.close()
    assert s1["warm_start/cache_hit"] == 0 and s1["warm_start/sft_steps_this_run"] > 0
    assert 0 <= s1["warm_start/heldout_action_exact_match"] <= 1
    second = make_trainer(tmp_path / "b", *WARM)
    try:
        calls = []
        second.session.trained.engine.step = lambda: calls.append(1)
        s2 = second.warm_start()
        assert s2["warm_start/cache_hit"] == 1 and s2["warm_start/sft_steps_this_run"] == 0 and not calls
        assert all(torch.equal(weights[k], v) for k, v in second.session.trained.model.state_dict().items())
    finally:
        second.close()
    other = make_trainer(tmp_path / "c", *WARM, "warm_start.lr=2e-3")  # another setting: another entry
    try:
        assert other.session.warm_starter.cache_dir() != first.session.warm_starter.cache_dir()
    finally:
        other.close()


def test_lora_reference_is_the_warm_started_policy(tmp_path, toy_env_ids) -> None:
    trainer = make_trainer(tmp_path, *WARM, "warm_start.cache=off", "model.lora=true", "algorithm.kl_coef=0.1",
                           "optim.lr=0.05", "trainer.total_steps=1")
    try:
        base = [p.detach().clone() for p in trainer.session.trained.model.parameters() if p.requires_grad]
        trainer.warm_start()
        trainer.session.reference.setup()
        assert any(not torch.equal(a, p) for a, p in zip(base, [p for p in trainer.session.trained.model.parameters()
                                                                 if p.requires_grad], strict=True))
        batch = trainer.score(trainer.collect())
        prompts = [r.prompt_ids for r in batch.rows]
        responses = [r.response_ids for r in batch.rows]
        policy = batched_response_logprobs(trainer.session.trained.model, prompts, responses, pad_id=trainer.session.trained.tokenizer.pad_token_id)
        ref = trainer.session.reference.logprobs(prompts, responses)
        for a, b in zip(policy, ref, strict=True):
            torch.testing.assert_close(a, b)  # RL starts exactly at the reference
        with trainer.session.trained.model.disable_adapter():
            plain = batched_response_logprobs(trainer.session.trained.model, prompts, responses, pad_id=trainer.session.trained.tokenizer.pad_token_id)
        assert any(not torch.allclose(a, b) for a, b in zip(plain, ref, strict=True))  # not the pre-SFT base
        trainable = {n for n, p in trainer.session.trained.model.named_parameters() if p.requires_grad}
        assert trainable and not any(".reference." in n for n in trainable)
        trainer.step()
        after = trainer.session.reference.logprobs(prompts, responses)
        for a, b in zip(ref, after, strict=True):
            torch.testing.assert_close(a, b)  # the reference stays frozen while the policy trains
        assert {n for n, p in trainer.session.trained.model.named_parameters() if p.requires_grad} == trainable
    finally:
        trainer.close()


def test_learning_summary_reports_before_and_after(tmp_path) -> None:
    import json

    from agentgym_opsd.trainer.cli import learning_summary

    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "val/success_rate": 0.25, "pool/success_rate": 0.5}, {"step": 1, "success_rate": 0.4},
             {"step": 2, "val/success_rate": 0.375, "pool/success_rate": 0.75}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "{cut by a kill")
    assert learning_summary(path) == ["held-out success: 25.0% (step 0) -> 37.5% (step 2)",
                                      "training-pool success: 50.0% (step 0) -> 75.0% (step 2)"]
    assert learning_summary(tmp_path / "missing.jsonl") == []


def test_learning_summary_gives_intervals_and_warns_when_worse_beyond_chance(tmp_path) -> None:
    import json

    from agentgym_opsd.evaluation.metrics import wilson_interval
    from agentgym_opsd.trainer.cli import learning_summary

    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "val/success_rate": 0.75, "val/episodes": 48, "pool/success_rate": 0.5, "pool/episodes": 64},
             {"step": 12, "val/success_rate": 0.25, "val/episodes": 48, "pool/success_rate": 0.5, "pool/episodes": 64}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = learning_summary(path)
    lo, hi = wilson_interval(36, 48)
    assert out[0].startswith(f"held-out success: 75.0% [{100 * lo:.0f}, {100 * hi:.0f}] (step 0) -> 25.0%")
    assert out[1].startswith("WARNING: held-out success after training lies wholly below")
    assert len(out) == 3 and not out[2].startswith("WARNING")  # the pool did not move: no warning


def test_learning_summary_compares_the_held_out_episodes_one_by_one(tmp_path) -> None:
    import json

    from agentgym_opsd.trainer.cli import learning_summary
    from agentgym_opsd.trainer.validation import validation_file, write_episode_outcomes

    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 0, "val/success_rate": 0.5, "val/episodes": 40}, {"step": 6, "val/success_rate": 0.3,
                                                                         "val/episodes": 40}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # 40 episodes: 12 won both times, 8 won before only, 0 won after only, 20 lost both times
    won = {0: [True] * 20 + [False] * 20, 6: [True] * 12 + [False] * 28}
    for step, outcomes in won.items():
        write_episode_outcomes(validation_file(tmp_path, step),
                               [{"env_spec": "ALFWorld-v0", "seed": 10_000 + i, "won": w} for i, w in enumerate(outcomes)])
    out = learning_summary(path)
    assert out[1].startswith("held-out episodes: 0 won that were lost, 8 lost that were won, of 40 (change -20.0 "
                             "points, paired 95% interval [")
    # the two 40-episode intervals overlap, the paired comparison of the same episodes does not reach 0
    assert out[2].startswith("WARNING: held-out success after training is lower on the same episodes beyond chance")
    (tmp_path / "validation" / "step_000006.jsonl").unlink()  # episodes not kept: the plain lines only
    assert len(learning_summary(path)) == 1


def test_warm_start_can_leave_the_rl_pool_to_rl(tmp_path, toy_env_ids, monkeypatch) -> None:
    import agentgym_opsd.trainer.warm_start as warm_start

    seen = []
    real = warm_start.collect_demonstrations

    def spy(runner, tasks, **kwargs):
        seen.extend(t.options["task_index"] for t in tasks)
        return real(runner, tasks, **kwargs)

    monkeypatch.setattr(warm_start, "collect_demonstrations", spy)
    trainer = make_trainer(tmp_path, "warm_start.steps=1", "warm_start.episodes=0", "warm_start.cache=off",
                           "warm_start.exclude_rl_pool=true", "env.num_train_tasks=2")
    try:
        trainer.warm_start()
    finally:
        trainer.close()
    assert seen and sorted(seen) == list(range(2, trainer.session.envs[0].env_num_tasks))  # every game but the pool, once


def test_a_half_published_warm_start_is_replaced_and_dead_writers_leftovers_removed(tmp_path, toy_env_ids) -> None:
    import subprocess
    import sys

    from agentgym_opsd.files import remove_dead_tmp_dirs

    trainer = make_trainer(tmp_path / "run")
    try:
        cache = tmp_path / "cache" / "KEY"
        cache.mkdir(parents=True)
        (cache / "model").mkdir()  # killed between the two renames of the old publish: no summary.json
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        leftover = cache.parent / f".KEY.{dead.pid}.deadbeef.tmp"
        (leftover / "model").mkdir(parents=True)
        live = cache.parent / f".KEY.{os.getpid()}.cafecafe.tmp"
        live.mkdir()
        trainer.session.warm_starter.save_atomically(trainer.session.trained, cache, {"warm_start/sft_steps": 1.0})
        assert (cache / "summary.json").is_file() and (cache / "model" / "config.json").is_file()
        assert not leftover.exists() and live.exists()  # the dead writer's copy is gone, the live one's stays
        # a second writer finds a complete entry: it keeps the first one and leaves nothing behind
        before = (cache / "summary.json").read_text()
        trainer.session.warm_starter.save_atomically(trainer.session.trained, cache, {"warm_start/sft_steps": 2.0})
        assert (cache / "summary.json").read_text() == before
        assert sorted(p.name for p in cache.parent.iterdir()) == sorted(["KEY", live.name])
        assert remove_dead_tmp_dirs(cache) == []
    finally:
        trainer.close()


def test_warm_start_seed_lets_rl_seeds_share_one_cached_warm_start(tmp_path, toy_env_ids) -> None:
    keys = {}
    for name, overrides in {"default0": ["trainer.seed=0"], "fixed0_rl1": ["trainer.seed=1", "warm_start.seed=0"],
                            "fixed0_rl2": ["trainer.seed=2", "warm_start.seed=0"], "default1": ["trainer.seed=1"],
                            "fixed1": ["trainer.seed=0", "warm_start.seed=1"]}.items():
        trainer = make_trainer(tmp_path / name, "warm_start.steps=1", *overrides)
        try:
            keys[name] = trainer.session.warm_starter.cache_dir()
        finally:
            trainer.close()
    # warm_start.seed=-1 means trainer.seed, so keys from before the field existed are unchanged
    assert keys["default0"] == keys["fixed0_rl1"] == keys["fixed0_rl2"]
    assert keys["default1"] == keys["fixed1"] != keys["default0"]


# ---- loss aggregation: every token alike, or every trajectory alike ---------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 40)), min_size=1, max_size=30))
def test_seq_mean_weights_give_every_trajectory_the_same_share_of_the_step(rows) -> None:
    trajectory, tokens = [t for t, _ in rows], [n for _, n in rows]
    assert row_loss_weights("token-mean", trajectory, tokens) == [1.0] * len(rows)
    weights = row_loss_weights("seq-mean-token-mean", trajectory, tokens)
    total = sum(tokens)
    assert math.isclose(sum(w * n for w, n in zip(weights, tokens, strict=True)), total, rel_tol=1e-9)
    shares = {}
    for t, w, n in zip(trajectory, weights, tokens, strict=True):
        shares[t] = shares.get(t, 0.0) + w * n
    assert all(math.isclose(s, total / len(shares), rel_tol=1e-9) for s in shares.values())
    if len({sum(n for t2, n in rows if t2 == t) for t in shares}) == 1:  # equal lengths: the two modes agree
        assert all(math.isclose(w, 1.0) for w in weights)


def test_row_loss_weights_reject_an_unknown_mode_and_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="loss_agg_mode"):
        row_loss_weights("seq-mean", [0], [3])
    with pytest.raises(ValueError, match="rows"):
        row_loss_weights("token-mean", [0, 1], [3])


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_policy_loss_is_the_mean_the_mode_names(tmp_path, toy_env_ids, mode) -> None:
    # One mini-batch from pi_old (ratio 1): the policy loss is minus the mean advantage, over the step's tokens
    # (token-mean) or over trajectories of each one's token mean (seq-mean-token-mean). The advantages differ by
    # trajectory and the trajectories by length, so the two means differ.
    trainer = make_trainer(tmp_path, "algorithm.ppo_mini_batch_rows=0", "algorithm.entropy_coef=0",
                           "algorithm.kl_coef=0", f"algorithm.loss_agg_mode={mode}")
    try:
        trajs = trainer.collect()
        trajs[0].turns = trajs[0].turns[:1]  # one short trajectory, as a quick win beside rollouts run to the limit
        batch = trainer.score(trajs)
        traj = batch.traj_index.tolist()
        old = [torch.tensor(r.sample_logprobs) for r in batch.rows]
        adv = [torch.full((len(r.response_ids),), float(t % 3) - 1.0 + 0.1 * i) for i, (r, t) in
               enumerate(zip(batch.rows, traj, strict=True))]
        metrics = trainer.update(batch, PolicyLogProbs(old), BatchAdvantages(adv, torch.zeros(0), torch.zeros(0), None))
        token_mean = float(torch.cat(adv).mean())
        per_traj: dict[int, list[torch.Tensor]] = {}
        for t, a in zip(traj, adv, strict=True):
            per_traj.setdefault(t, []).append(a)
        seq_mean = float(np.mean([float(torch.cat(v).mean()) for v in per_traj.values()]))
        assert len({sum(len(a) for a in v) for v in per_traj.values()}) > 1  # lengths differ: the means differ
        assert abs(token_mean - seq_mean) > 1e-3
        expected = token_mean if mode == "token-mean" else seq_mean
        assert metrics["policy_loss"] == pytest.approx(-expected, rel=1e-3, abs=1e-4)
    finally:
        trainer.close()
