"""The CPU recipe never rewards failure: with `penalty_mode=outcome`, no row of a lost trajectory gets a positive
advantage, in any estimator the presets use, no invalid turn gains from its rollout's win, and the invalid-action
push stays small beside the outcome advantage. The released semantics (`penalty_mode=turn` with cross-step statistics) are kept for reproduction;
the last test shows, by hand, what they do to an all-failed group (docs/method.md)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.credit import CreditConfig
from agentgym_opsd.records import Trajectory, Turn
from agentgym_opsd.trainer.turn_batch import batch_advantages, build_turn_batch

ESTIMATORS = ("grpo", "agentopsd", "agentopsd-raw_gap", "agentopsd-unsigned", "agentopsd-no_prior", "gigpo",
              "agentopsd+gigpo")
KINDS = (None, None, None, "no_tag", "not_admissible", "truncated")


def _turn(i: int, kind: str | None, obs: str) -> Turn:
    return Turn(index=i, prompt=[{"role": "user", "content": f"turn {i}"}], response_text="x",
                action="" if kind in ("no_tag", "truncated") else "go", action_valid=kind is None, observation=obs,
                reward=0.0, response_token_ids=[5, 6], response_logprobs=[-1.0, -1.0],
                info={"invalid_kind": kind} if kind else {})


def _traj(traj_id: int, group: int, won: bool, kinds: list[str | None]) -> Trajectory:
    turns = [_turn(i, k, f"room {i % 2}") for i, k in enumerate(kinds)]
    if won:  # the environment's reward arrives on the winning turn
        turns[-1].reward = 1.0
    return Trajectory(env_id="toy", task_id=f"t{group}", task_type="", group_id=group, traj_id=traj_id, seed=0,
                      won=won, turns=turns)


@st.composite
def step_batches(draw, all_failed: bool = False):
    """Groups of 2-8 rollouts of 1-6 turns, random outcomes and invalid turns, random teacher evidence."""
    trajs: list[Trajectory] = []
    for group in range(draw(st.integers(1, 3))):
        for _ in range(draw(st.integers(2, 8))):
            kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
            won = False if all_failed else draw(st.booleans())
            trajs.append(_traj(len(trajs), group, won, kinds))
    rows = sum(t.num_turns for t in trajs)
    evidence = draw(st.lists(st.floats(-30, 30), min_size=rows, max_size=rows))
    penalty = draw(st.sampled_from([0.01, 0.1, 0.2]))
    return trajs, torch.tensor(evidence, dtype=torch.float64), penalty


def _advantages(trajs, evidence, penalty, estimator, *, mode="outcome", cross_steps=False, lam=0.5, gain=False):
    batch = build_turn_batch(trajs, encode_prompt=lambda m: [1, 2, 3],
                             invalid_penalty=penalty, penalty_mode=mode)
    gaps = [torch.full((2,), float(e) / 2) for e in evidence]
    out = batch_advantages(batch, evidence, gaps, estimator=estimator, config=CreditConfig(lam=lam),
                           cross_steps=cross_steps, penalised_turns_gain=gain)
    return batch, out


@settings(max_examples=60, deadline=None)
@given(step_batches(all_failed=True), st.sampled_from(ESTIMATORS), st.floats(0.0, 1.0))
def test_an_all_failed_group_gives_no_positive_advantage_on_any_row(case, estimator, lam) -> None:
    trajs, evidence, penalty = case
    _, out = _advantages(trajs, evidence, penalty, estimator, lam=lam)
    assert all(float(tok.max()) <= 0.0 for tok in out.tokens)
    assert float(out.seq.abs().max()) == 0.0  # no outcome signal at all in such a group


@settings(max_examples=60, deadline=None)
@given(step_batches(), st.sampled_from(ESTIMATORS), st.floats(0.0, 1.0))
def test_no_row_of_a_lost_trajectory_is_positive_in_any_group(case, estimator, lam) -> None:
    trajs, evidence, penalty = case
    batch, out = _advantages(trajs, evidence, penalty, estimator, lam=lam)
    for row, ti in enumerate(batch.traj_index.tolist()):
        if not trajs[ti].won:
            assert float(out.tokens[row].max()) <= 0.0


@settings(max_examples=60, deadline=None)
@given(step_batches())
def test_the_penalty_push_is_bounded_by_the_outcome_advantage(case) -> None:
    trajs, evidence, penalty = case
    batch, out = _advantages(trajs, evidence, penalty, "grpo")
    # only invalid turns are pushed, by exactly the penalty, whatever the group's statistics
    for row, ti in enumerate(batch.traj_index.tolist()):
        expected = penalty if trajs[ti].turns[batch.rows[row].turn_id].invalid_kind else 0.0
        assert float(-out.penalty[row]) == pytest.approx(expected)
    # with binary outcomes every non-zero |A_seq| of a group of G is at least 1/sqrt(G) (unbiased std), so the
    # push is at most penalty * sqrt(G) times the outcome advantage it rides on
    for ti, traj in enumerate(trajs):
        size = sum(t.group_id == traj.group_id for t in trajs)
        seq = abs(float(out.seq[ti]))
        if seq > 0:
            assert penalty <= penalty * math.sqrt(size) * seq * (1 + 1e-4)
            assert seq >= 1 / math.sqrt(size) * (1 - 1e-4)


def test_outcome_mode_by_hand() -> None:
    # Group 0: a win with an invalid second turn, a loss with one valid turn. Group 1: two losses, one invalid.
    trajs = [_traj(0, 0, True, [None, "no_tag"]), _traj(1, 0, False, [None]),
             _traj(2, 1, False, [None, "not_admissible"]), _traj(3, 1, False, [None])]
    batch, out = _advantages(trajs, torch.zeros(6, dtype=torch.float64), 0.1, "grpo")
    s = math.sqrt(0.5) + 1e-6  # unbiased std of rewards 1 and 0
    assert out.seq.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0])
    # the win's invalid turn has no share in it: only the push down
    assert [float(t[0]) for t in out.tokens] == pytest.approx([0.5 / s, -0.1, -0.5 / s, 0.0, -0.1, 0.0])
    _, kept = _advantages(trajs, torch.zeros(6, dtype=torch.float64), 0.1, "grpo", gain=True)  # as before the option
    assert [float(t[0]) for t in kept.tokens] == pytest.approx([0.5 / s, 0.5 / s - 0.1, -0.5 / s, 0.0, -0.1, 0.0])


@settings(max_examples=60, deadline=None)
@given(step_batches(), st.sampled_from(ESTIMATORS), st.floats(0.0, 1.0))
def test_no_penalised_turn_gains_from_its_rollouts_win(case, estimator, lam) -> None:
    trajs, evidence, penalty = case
    batch, out = _advantages(trajs, evidence, penalty, estimator, lam=lam)
    _, kept = _advantages(trajs, evidence, penalty, estimator, lam=lam, gain=True)
    for row, pushed in enumerate(out.penalty.tolist()):
        if pushed < 0:  # a penalised turn: at most the push, and never above what it had before
            assert float(out.tokens[row].max()) <= pushed + 1e-6
            assert torch.all(out.tokens[row] <= kept.tokens[row] + 1e-6)
        else:  # every other row keeps its estimator's advantage
            assert torch.equal(out.tokens[row], kept.tokens[row])


def test_the_released_semantics_reward_valid_turns_of_an_all_failed_group() -> None:
    # What `penalty_mode=turn` + cross-step statistics do (kept for the release presets): the penalised row
    # pulls the group mean below zero, so every valid turn of these lost rollouts scores above it.
    trajs = [_traj(0, 0, False, [None, "no_tag"]), _traj(1, 0, False, [None, None])]
    _, out = _advantages(trajs, torch.zeros(4, dtype=torch.float64), 0.1, "grpo", mode="turn", cross_steps=True)
    first = [float(t[0]) for t in out.tokens]
    assert sum(a > 0 for a in first) == 3 and first[1] < -1.0  # three rows rewarded, the penalty ~ -1.5
    _, fixed = _advantages(trajs, torch.zeros(4, dtype=torch.float64), 0.1, "grpo")
    assert [float(t[0]) for t in fixed.tokens] == pytest.approx([0.0, -0.1, 0.0, 0.0])


@st.composite
def scored_batches(draw):
    """Like `step_batches`, with a graded outcome: each rollout's score (WebShop's R) in {0, 0.25, ..., 1}
    arrives as the reward of its last turn; won iff the score is 1."""
    trajs, evidence, penalty = draw(step_batches())
    for t in trajs:
        t.score = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]))
        t.won = t.score == 1.0
        for turn in t.turns:
            turn.reward = 0.0
        t.turns[-1].reward = t.score
    return trajs, evidence, penalty


SIGN_PRESERVING = tuple(e for e in ESTIMATORS if "gigpo" not in e)  # sign(Ã_k) = sign(A_seq) on every row


def _scored_advantages(trajs, evidence, penalty, estimator, lam):
    batch = build_turn_batch(trajs, encode_prompt=lambda m: [1, 2, 3],
                             invalid_penalty=penalty, penalty_mode="outcome", outcome="score")
    assert batch.traj_rewards.tolist() == [t.score for t in trajs]
    gaps = [torch.full((2,), float(e) / 2) for e in evidence]
    return batch, batch_advantages(batch, evidence, gaps, estimator=estimator, config=CreditConfig(lam=lam))


def _below_mean_rows(trajs, batch, *, scored_nothing: bool = False):
    for row, ti in enumerate(batch.traj_index.tolist()):
        group = [t.score for t in trajs if t.group_id == trajs[ti].group_id]
        if trajs[ti].score < sum(group) / len(group) - 1e-9 and (trajs[ti].score == 0.0 or not scored_nothing):
            yield row


@settings(max_examples=60, deadline=None)
@given(scored_batches(), st.sampled_from(SIGN_PRESERVING), st.floats(0.0, 1.0))
def test_with_a_graded_outcome_no_row_below_its_group_mean_is_positive(case, estimator, lam) -> None:
    trajs, evidence, penalty = case
    batch, out = _scored_advantages(trajs, evidence, penalty, estimator, lam)
    for row in _below_mean_rows(trajs, batch):
        assert float(out.tokens[row].max()) <= 0.0


@settings(max_examples=60, deadline=None)
@given(scored_batches(), st.sampled_from(("gigpo", "agentopsd+gigpo")), st.floats(0.0, 1.0))
def test_with_a_graded_outcome_gigpo_never_rewards_a_rollout_that_scored_nothing(case, estimator, lam) -> None:
    """GiGPO's step term compares turns taken from the same state, so with a graded outcome a turn of a
    below-mean rollout can rightly earn more than the turns of a worse rollout from that state (next test).
    A rollout that scored nothing has the lowest return in every state it visits: none of its rows is positive."""
    trajs, evidence, penalty = case
    batch, out = _scored_advantages(trajs, evidence, penalty, estimator, lam)
    for row in _below_mean_rows(trajs, batch, scored_nothing=True):
        assert float(out.tokens[row].max()) <= 0.0


def test_gigpo_credits_a_below_mean_turn_that_beat_a_worse_rollout_from_the_same_state() -> None:
    """The case hypothesis found: one group scoring 0, 1, 1, 1, 1, 0.5, 0.75, 1 (mean 0.78). The 0.75 rollout is
    just below the mean, but its second turn, from the state the 0.5 rollout's second turn started in, led to
    more: GiGPO's step term for it outweighs its small negative episode term. GRPO keeps the row negative."""
    def scored(traj_id: int, turns: int, score: float) -> Trajectory:
        t = _traj(traj_id, 0, score == 1.0, [None] * turns)
        t.score, t.turns[-1].reward = score, score
        return t

    trajs = [scored(i, n, score) for i, (n, score) in
             enumerate([(1, 0.0), (1, 1.0), (1, 1.0), (1, 1.0), (1, 1.0), (2, 0.5), (2, 0.75), (1, 1.0)])]
    evidence = torch.zeros(sum(t.num_turns for t in trajs), dtype=torch.float64)
    batch, gigpo = _scored_advantages(trajs, evidence, 0.1, "gigpo", 0.0)
    _, grpo = _scored_advantages(trajs, evidence, 0.1, "grpo", 0.0)
    second_turn = [r for r, ti in enumerate(batch.traj_index.tolist()) if ti == 6][1]
    assert float(gigpo.tokens[second_turn].max()) > 0.0 > float(grpo.tokens[second_turn].max())
    assert all(float(gigpo.tokens[r].max()) <= 0.0 for r, ti in enumerate(batch.traj_index.tolist()) if ti == 0)


def test_a_graded_outcome_is_scored_and_sampled_on_the_score() -> None:
    from agentgym_opsd.trainer.dynamic_sampling import is_informative
    from agentgym_opsd.trainer.turn_batch import group_success_rates

    half, none = _traj(0, 0, False, [None]), _traj(1, 0, False, [None])
    half.score = 0.5
    assert not is_informative([half, none]) and is_informative([half, none], outcome="score")
    assert group_success_rates([half, none]) == {0: 0.0}
    assert group_success_rates([half, none], outcome="score") == {0: 0.25}
    with pytest.raises(ValueError, match="outcome must be one of"):
        half.outcome("reward")


def test_the_config_names_a_bad_outcome() -> None:
    from agentgym_opsd.trainer.config import ConfigError, load_config

    assert load_config("cpu-tiny", ["env.outcome=score"]).env.outcome == "score"
    with pytest.raises(ConfigError, match="env.outcome"):
        load_config("cpu-tiny", ["env.outcome=reward"])


def test_the_step_metrics_count_the_invalid_turns_of_won_rollouts() -> None:
    from types import SimpleNamespace

    from agentgym_opsd.trainer.metrics import step_metrics
    from agentgym_opsd.trainer.turn_batch import StepRecord

    trajs = [_traj(0, 0, True, [None, "not_admissible", "no_tag"]), _traj(1, 0, False, ["not_admissible"]),
             _traj(2, 1, True, [None]), _traj(3, 1, True, ["truncated"])]  # group 1: all won, A_seq = 0
    batch, out = _advantages(trajs, torch.zeros(6, dtype=torch.float64), 0.1, "agentopsd")
    record = StepRecord(batch, SimpleNamespace(old=[torch.tensor(r.sample_logprobs) for r in batch.rows]),
                        SimpleNamespace(evidence=torch.zeros(6), forms=[], teacher_rows=0), out)
    assert step_metrics(record, {}, lam=0.5)["won_invalid_rows"] == 2.0  # the two of the won rollout above its group
