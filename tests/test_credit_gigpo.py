"""Tests of GiGPO, AgentOPSD + GiGPO and the estimator registry: fast == slow reference, properties, dispatch."""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.credit import (
    ESTIMATORS,
    STEP_NORMS,
    VARIANTS,
    CreditConfig,
    CreditConfigError,
    CreditInputs,
    agentopsd_advantages,
    agentopsd_gigpo_advantages,
    anchor_groups,
    estimate,
    estimator_spec,
    gigpo_advantages,
    gigpo_step_advantages,
    pad_ragged,
    reference_agentopsd_advantages,
    reference_gigpo_step_advantages,
    step_discounted_returns,
)
from agentgym_opsd.records import Trajectory, Turn
from agentgym_opsd.trainer.config import ConfigError, load_config
from agentgym_opsd.trainer.turn_batch import anchor_key, build_turn_batch

F64 = torch.float64
FAST = settings(max_examples=40, deadline=None)


@st.composite
def anchored_batches(draw, max_groups: int = 3, max_group_size: int = 4, max_turns: int = 6, num_states: int = 4):
    """Shuffled turn rows of a few task groups; states are drawn from a small pool so anchors repeat."""
    dense_ids = draw(st.booleans())
    rows = []  # (adv, evidence, traj, turn, rate, group, key, reward, penalty)
    next_traj = draw(st.integers(0, 5)) if dense_ids else draw(st.integers(-(10**6), 10**6))
    for group in draw(st.lists(st.integers(-50, 50), min_size=1, max_size=max_groups, unique=True)):
        rate = draw(st.floats(0, 1))
        for _ in range(draw(st.integers(1, max_group_size))):
            traj = next_traj
            next_traj += 1 if dense_ids else draw(st.integers(1, 10**5))
            adv = draw(st.floats(-3, 3, allow_nan=False))
            num_turns = draw(st.integers(1, max_turns))
            turn_range = st.integers(0, 12) if dense_ids else st.integers(0, 1000)
            turns = sorted(draw(st.lists(turn_range, min_size=num_turns, max_size=num_turns, unique=True)))
            for turn in turns:
                key = draw(st.integers(0, num_states - 1)) * 7919 - 3  # any integers, negatives included
                reward = draw(st.sampled_from([0.0, 0.0, 1.0, draw(st.floats(-2, 2, allow_nan=False))]))
                penalty = draw(st.sampled_from([0.0, 0.0, 0.1]))
                evidence = draw(st.floats(-6, 6, allow_nan=False))
                rows.append((adv, evidence, traj, turn, rate, group, key, reward, penalty))
    rows = draw(st.permutations(rows))
    cols = list(zip(*rows, strict=True))
    floats = [torch.tensor(cols[i], dtype=F64) for i in (0, 1, 4, 7, 8)]
    ints = [torch.tensor(cols[i], dtype=torch.long) for i in (2, 3, 5, 6)]
    adv, ev, rate, reward, penalty = floats
    traj, turn, group, key = ints
    return CreditInputs(adv, traj, turn, rate, evidence=ev, group_ids=group, anchor_keys=key,
                        turn_rewards=reward, turn_penalties=penalty)


configs = st.builds(
    CreditConfig,
    lam=st.floats(0, 1),
    band=st.floats(0.01, 0.99),
    gamma=st.floats(0.05, 1.0),
    eps0=st.floats(1e-4, 0.4),
    variant=st.sampled_from(VARIANTS),
    omega=st.floats(0, 3),
    step_gamma=st.floats(0, 1),
    step_norm=st.sampled_from(STEP_NORMS),
)


def _step(b: CreditInputs, cfg: CreditConfig, fn=gigpo_step_advantages) -> torch.Tensor:
    return fn(b.traj_ids, b.turn_ids, b.group_ids, b.anchor_keys, b.turn_rewards, turn_penalties=b.turn_penalties,
              step_gamma=cfg.step_gamma, step_norm=cfg.step_norm, eps=cfg.eps)


def _opsd(b: CreditInputs, cfg: CreditConfig, fn=agentopsd_advantages) -> torch.Tensor:
    return fn(b.seq_advantages, b.evidence, b.traj_ids, b.turn_ids, b.success_rate, **cfg.agentopsd_kwargs())


# ------------------------------------------------------------------------------------------------ GiGPO


@FAST
@given(anchored_batches(), configs)
def test_gigpo_step_matches_reference_loop(batch, cfg):
    fast, slow = _step(batch, cfg), _step(batch, cfg, reference_gigpo_step_advantages)
    assert fast.dtype == F64
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-9)


@FAST
@given(anchored_batches(), configs)
def test_estimators_match_their_references(batch, cfg):
    step = _step(batch, cfg, reference_gigpo_step_advantages)
    gigpo = estimate("gigpo", batch, cfg).advantages
    torch.testing.assert_close(gigpo, batch.seq_advantages + cfg.omega * step, rtol=1e-9, atol=1e-9)
    combined = estimate("agentopsd+gigpo", batch, cfg).advantages
    expected = _opsd(batch, cfg, reference_agentopsd_advantages) + cfg.omega * step
    torch.testing.assert_close(combined, expected, rtol=1e-9, atol=1e-9)


@FAST
@given(anchored_batches(), configs)
def test_step_term_sums_to_zero_in_every_anchor_group(batch, cfg):
    step = _step(batch, cfg)
    index, size = anchor_groups(batch.group_ids, batch.anchor_keys)
    sums = torch.zeros(int(index.max()) + 1, dtype=F64).index_add_(0, index, step)
    scale = 1.0 if cfg.step_norm == "mean_norm" else 1.0 / cfg.eps  # a near-constant group may divide by ε
    assert sums.abs().max() <= 1e-9 * scale * (1 + step.abs().max())
    assert bool((step[size == 1] == 0).all())  # a state seen once has nothing to be compared with


@FAST
@given(anchored_batches(), configs)
def test_one_anchor_group_per_turn_leaves_agentopsd_and_the_episode_term(batch, cfg):
    unique_keys = torch.arange(batch.num_rows)  # every turn its own state
    b = CreditInputs(**{**batch.__dict__, "anchor_keys": unique_keys})
    assert torch.equal(estimate("gigpo", b, cfg).advantages, batch.seq_advantages)
    assert torch.equal(estimate("agentopsd+gigpo", b, cfg).advantages, _opsd(batch, cfg))


@FAST
@given(anchored_batches(), configs)
def test_omega_zero_is_agentopsd_and_lambda_zero_is_gigpo(batch, cfg):
    off = CreditConfig(**{**cfg.__dict__, "omega": 0.0})
    assert torch.equal(estimate("agentopsd+gigpo", batch, off).advantages, _opsd(batch, cfg))
    assert torch.equal(estimate("gigpo", batch, off).advantages, batch.seq_advantages)
    no_lam = CreditConfig(**{**cfg.__dict__, "lam": 0.0})
    assert torch.equal(estimate("agentopsd+gigpo", batch, no_lam).advantages, estimate("gigpo", batch, cfg).advantages)


@FAST
@given(anchored_batches(), configs, st.randoms(use_true_random=False))
def test_gigpo_row_order_invariance(batch, cfg, rnd):
    perm = list(range(batch.num_rows))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    shuffled = CreditInputs(**{k: v[p] if v is not None else None for k, v in batch.__dict__.items()})
    for name in ("gigpo", "agentopsd+gigpo"):
        torch.testing.assert_close(estimate(name, shuffled, cfg).advantages, estimate(name, batch, cfg).advantages[p],
                                   rtol=1e-12, atol=1e-12)


def test_gigpo_hand_computed():
    # one task group, two trajectories: A = s0 -> s1 -> win; B = s0 -> s2 (lost, invalid second turn)
    traj = torch.tensor([0, 0, 1, 1])
    turn = torch.tensor([0, 1, 0, 1])
    group = torch.tensor([3, 3, 3, 3])
    key = torch.tensor([100, 101, 100, 102])
    reward = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=F64)
    penalty = torch.tensor([0.0, 0.0, 0.0, 0.1], dtype=F64)
    returns = step_discounted_returns(traj, turn, reward, step_gamma=0.95)
    assert returns.tolist() == pytest.approx([0.95, 1.0, 0.0, 0.0])
    step = gigpo_step_advantages(traj, turn, group, key, reward, turn_penalties=penalty)
    # anchor s0 = {A0: 0.95, B0: 0.0}: mean 0.475; s1 and s2 are alone
    assert step.tolist() == pytest.approx([0.475, 0.0, -0.475, 0.0])
    std = math.sqrt(2 * 0.475**2)  # unbiased std of two values
    step_std = gigpo_step_advantages(traj, turn, group, key, reward, step_norm="mean_std_norm")
    assert step_std.tolist() == pytest.approx([0.475 / (std + 1e-6), 0.0, -0.475 / (std + 1e-6), 0.0])
    seq = torch.tensor([0.7, 0.7, -0.7, -0.7], dtype=F64)
    got = gigpo_advantages(seq, traj, turn, group, key, reward, turn_penalties=penalty, omega=2.0)
    assert got.tolist() == pytest.approx([0.7 + 0.95, 0.7, -0.7 - 0.95, -0.7])


def test_anchor_groups_do_not_cross_task_groups():
    index, size = anchor_groups(torch.tensor([0, 0, 1, 1]), torch.tensor([9, 9, 9, 8]))
    assert index[0] == index[1] and index[2] != index[0] and index[3] != index[2]
    assert size.tolist() == [2, 2, 1, 1]


def test_step_gamma_zero_and_one():
    traj, turn = torch.tensor([0, 0, 0]), torch.tensor([2, 0, 1])
    reward = torch.tensor([1.0, 2.0, 4.0], dtype=F64)
    assert step_discounted_returns(traj, turn, reward, step_gamma=0.0).tolist() == [1.0, 2.0, 4.0]
    assert step_discounted_returns(traj, turn, reward, step_gamma=1.0).tolist() == [1.0, 7.0, 5.0]


def test_long_trajectories_use_the_blocked_scan():
    n = 300  # more than one scan block
    traj, turn = torch.zeros(n, dtype=torch.long), torch.arange(n)
    reward = torch.zeros(n, dtype=F64)
    reward[-1] = 1.0
    got = step_discounted_returns(traj, turn, reward, step_gamma=0.99)
    torch.testing.assert_close(got, 0.99 ** (n - 1 - turn).to(F64), rtol=1e-12, atol=0)


def test_agentopsd_gigpo_function_equals_the_estimator():
    b = CreditInputs(torch.tensor([1.0, 1.0, -1.0], dtype=F64), torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]),
                     torch.full((3,), 0.5, dtype=F64), evidence=torch.tensor([0.3, -0.2, 1.0], dtype=F64),
                     group_ids=torch.zeros(3, dtype=torch.long), anchor_keys=torch.tensor([1, 2, 1]),
                     turn_rewards=torch.tensor([0.0, 1.0, 0.0], dtype=F64))
    cfg = CreditConfig(omega=0.5)
    direct = agentopsd_gigpo_advantages(b.seq_advantages, b.evidence, b.traj_ids, b.turn_ids, b.success_rate,
                                        b.group_ids, b.anchor_keys, b.turn_rewards, config=cfg)
    assert torch.equal(direct, estimate("agentopsd+gigpo", b, cfg).advantages)


# ------------------------------------------------------------------------------------------------ details


@FAST
@given(anchored_batches(), configs)
def test_details_match_the_reference_loop(batch, cfg):
    result = estimate("agentopsd+gigpo", batch, cfg, return_details=True)
    ref: dict[str, torch.Tensor] = {}
    _opsd(batch, cfg, lambda *a, **k: reference_agentopsd_advantages(*a, **k, details=ref))
    for name in ("prior", "belief", "delta_belief", "weight"):
        torch.testing.assert_close(result.details[name], ref[name], rtol=1e-9, atol=1e-9, msg=name)
    torch.testing.assert_close(result.details["step_advantage"], _step(batch, cfg, reference_gigpo_step_advantages),
                               rtol=1e-9, atol=1e-9)
    # without details nothing extra is returned, and the numbers are the same
    plain = estimate("agentopsd+gigpo", batch, cfg)
    assert not plain.details and torch.equal(plain.advantages, result.advantages)


def test_token_details_summarise_each_turn():
    gaps, mask = pad_ragged([torch.tensor([0.5, -0.1, 2.0]), torch.tensor([0.0]), torch.zeros(0)])
    inputs = CreditInputs(torch.tensor([1.0, -1.0, 0.5], dtype=F64), torch.tensor([0, 0, 1]),
                          torch.tensor([0, 1, 0]), torch.full((3,), 0.25, dtype=F64), token_gaps=gaps, token_mask=mask)
    result = estimate("agentopsd-token", inputs, return_details=True)
    assert result.advantages.shape == (3, 3) and result.granularity == "token"
    d = result.details
    logit = math.log(0.25 / 0.75)
    c = 0.95**2 * 0.5 + 0.95 * -0.1 + 2.0
    assert float(d["belief"][0]) == pytest.approx(1 / (1 + math.exp(-(logit + c))))
    assert float(d["delta_belief"][2]) == 0.0 and float(d["weight"][2]) == 1.0  # no tokens: nothing moved
    per_token = result.token_advantages(mask)
    assert [t.numel() for t in per_token] == [3, 1, 0]
    assert float(per_token[0].mean()) == pytest.approx(float(d["weight"][0] * 0.5 + 0.5))


# ------------------------------------------------------------------------------------------------ registry


def test_specs_declare_what_each_estimator_needs():
    assert set(ESTIMATORS) >= {"grpo", "agentopsd", "agentopsd-token", "gigpo", "agentopsd+gigpo"}
    assert not ESTIMATORS["grpo"].needs_teacher and not ESTIMATORS["gigpo"].needs_teacher
    assert ESTIMATORS["agentopsd+gigpo"].needs_teacher and ESTIMATORS["agentopsd+gigpo"].needs_anchors
    assert ESTIMATORS["agentopsd-token"].granularity == "token"
    assert ESTIMATORS["agentopsd-token"].required_inputs == ("token_gaps", "token_mask")
    assert ESTIMATORS["gigpo"].required_inputs == ("group_ids", "anchor_keys", "turn_rewards")
    assert all(spec.summary for spec in ESTIMATORS.values())


def test_missing_inputs_and_unknown_names_are_clear_errors():
    b = CreditInputs(torch.ones(2, dtype=F64), torch.tensor([0, 0]), torch.tensor([0, 1]), torch.ones(2, dtype=F64))
    with pytest.raises(ValueError, match="'gigpo' needs group_ids, anchor_keys, turn_rewards"):
        estimate("gigpo", b)
    with pytest.raises(ValueError, match="'agentopsd' needs evidence"):
        estimate("agentopsd", b)
    with pytest.raises(ValueError, match="unknown estimator 'gae'"):
        estimator_spec("gae")
    with pytest.raises(ValueError, match="fixes variant='paper'"):
        estimate("agentopsd-token", b, CreditConfig(variant="unsigned"))
    assert torch.equal(estimate("grpo", b).advantages, b.seq_advantages)


@pytest.mark.parametrize(("field_name", "value"), [("omega", -1.0), ("omega", math.inf), ("step_gamma", 1.5),
                                                    ("step_norm", "std"), ("lam", 1.5), ("omega", math.nan)])
def test_credit_config_names_the_field(field_name, value):
    with pytest.raises(CreditConfigError, match=rf"CreditConfig\.{field_name}") as info:
        CreditConfig(**{field_name: value})
    assert info.value.field == field_name


def test_empty_inputs():
    e, i = torch.zeros(0, dtype=F64), torch.zeros(0, dtype=torch.long)
    b = CreditInputs(e, i, i, e, evidence=e, group_ids=i, anchor_keys=i, turn_rewards=e)
    for name in ("grpo", "agentopsd", "gigpo", "agentopsd+gigpo"):
        assert estimate(name, b, return_details=True).advantages.shape == (0,)


# ------------------------------------------------------------------------------------------------ trainer side


def _turn(index: int, prompt: str, observation: str, reward: float = 0.0, valid: bool = True) -> Turn:
    return Turn(index=index, prompt=[{"role": "user", "content": prompt}], response_text="a", action="a" if valid else "",
                action_valid=valid, observation=observation, reward=reward, response_token_ids=[7],
                response_logprobs=[-1.0], info={} if valid else {"invalid_kind": "no_tag"})


def test_turn_batch_carries_anchor_keys_turn_rewards_and_penalties():
    won = Trajectory(env_id="toy", task_id="t", task_type="x", group_id=4, traj_id=0, seed=0, won=True, turns=[
        _turn(0, "start", "room A"), _turn(1, "p1", "room B"), _turn(2, "p2", "done", reward=1.0)])
    lost = Trajectory(env_id="toy", task_id="t", task_type="x", group_id=4, traj_id=1, seed=0, turns=[
        _turn(0, "start", "room A"), _turn(1, "p1'", "room A", valid=False), _turn(2, "p2'", "room C")])
    batch = build_turn_batch([won, lost], encode_prompt=lambda m: [1, 2], reward_scale=10.0,
                             invalid_penalty=0.1)
    keys = batch.anchor_keys.tolist()
    assert keys[0] == keys[3]  # both first turns start from the same prompt
    assert keys[1] == keys[4] and keys[5] == keys[1]  # acted on "room A" (twice in the lost episode)
    assert keys[2] != keys[1] and keys[0] != keys[1]  # "room B"; a first prompt is never an observation
    assert batch.turn_rewards.tolist() == [0.0, 0.0, 10.0, 0.0, 0.0, 0.0]
    assert batch.turn_penalties.tolist() == [0.0, 0.0, 0.0, 0.0, 0.1, 0.0]
    assert batch.row_penalties.abs().sum() == 0  # penalty_mode="trajectory": the row term stays off
    assert anchor_key(won, 1) == keys[1] and 0 <= min(keys) and max(keys) < 2**63


@pytest.mark.parametrize(("override", "needle"), [
    ("algorithm.lam=1.5", "algorithm.lam: expected 0 ≤ lam ≤ 1, got 1.5"),
    ("algorithm.band=1.0", "algorithm.band"),
    ("algorithm.gamma=0", "algorithm.gamma"),
    ("algorithm.eps0=0.7", "algorithm.eps0"),
    ("algorithm.omega=-0.5", "algorithm.omega"),
    ("algorithm.step_gamma=2", "algorithm.step_gamma"),
    ("algorithm.step_norm=zscore", "algorithm.step_norm"),
    ("algorithm.variant=bogus", "algorithm.variant"),
    ("algorithm.estimator=gae", "algorithm.estimator"),
])
def test_bad_credit_settings_fail_at_config_load(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config("cpu-tiny", [override])


def test_config_dispatch_follows_the_registry():
    for name, spec in ESTIMATORS.items():
        cfg = load_config("cpu-tiny", [f"algorithm.estimator={name}"])
        assert cfg.algorithm.needs_teacher == spec.needs_teacher
    with pytest.raises(ConfigError, match="fixes variant='unsigned'"):
        load_config("cpu-tiny", ["algorithm.estimator=agentopsd-unsigned", "algorithm.variant=raw_gap"])
    cfg = load_config("cpu-tiny", ["algorithm.omega=0.5", "algorithm.step_norm=mean_std_norm"])
    assert cfg.algorithm.credit_config(lam=0.1) == CreditConfig(lam=0.1, omega=0.5, step_norm="mean_std_norm")
