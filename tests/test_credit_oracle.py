"""Oracle evidence (`agentopsd-oracle`): e_k is the oracle distance a turn closed, fed through AgentOPSD's
belief. On scripted ALFWorld play (expert steps and wasted ones) its raw e_k ranks every progress turn above
every wasted one (AUC 1) and its credit does too; zero progress is GRPO exactly; an environment without a
distance is refused; a training run picks it by name, runs no teacher pass and records its e_k."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.credit import ESTIMATORS, CreditConfig, CreditInputs, estimate
from agentgym_opsd.credit.oracle import NATS_PER_STEP, oracle_evidence
from agentgym_opsd.evaluation import credit_quality as cq
from agentgym_opsd.records import Trajectory, Turn
from agentgym_opsd.trainer.turn_batch import batch_advantages, build_turn_batch
from agentgym_opsd.turns import ORACLE_AFTER, ORACLE_BEFORE, PROGRESS, WASTED, oracle_progress, turn_progress


def test_registered_as_a_diagnostic_that_needs_no_teacher() -> None:
    spec = ESTIMATORS["agentopsd-oracle"]
    assert not spec.needs_teacher and spec.needs_oracle
    assert spec.required_inputs == ("oracle_progress",)
    assert "diagnostic" in spec.summary


def test_progress_of_a_turn() -> None:
    def turn(before: int | None, after: int | None) -> Turn:
        return Turn(0, [], "", "a", True, "", 0.0, info={ORACLE_BEFORE: before, ORACLE_AFTER: after})

    assert oracle_progress(turn(4, 3)) == 1.0
    assert oracle_progress(turn(4, 4)) == 0.0
    assert oracle_progress(turn(3, 5)) == -2.0  # a step away from the goal is negative evidence
    assert oracle_progress(turn(None, 3)) is None and oracle_progress(turn(3, None)) is None
    assert oracle_progress(Turn(0, [], "", "a", True, "", 0.0)) is None


def test_evidence_is_the_closed_distance_and_unknown_is_zero() -> None:
    e = oracle_evidence(torch.tensor([1.0, 0.0, -1.0, math.nan], dtype=torch.float64))
    assert e.tolist() == [NATS_PER_STEP, 0.0, -NATS_PER_STEP, 0.0]
    with pytest.raises(ValueError, match="oracle_distance"):
        oracle_evidence(torch.full((3,), math.nan, dtype=torch.float64))
    assert oracle_evidence(torch.zeros(0, dtype=torch.float64)).numel() == 0


@settings(max_examples=60, deadline=None)
@given(turns=st.lists(st.integers(1, 6), min_size=1, max_size=6),
       advantages=st.lists(st.floats(-3, 3, allow_nan=False), min_size=6, max_size=6),
       rate=st.floats(0, 1))
def test_zero_progress_is_grpo_exactly(turns: list[int], advantages: list[float], rate: float) -> None:
    traj = torch.tensor([t for t, k in enumerate(turns) for _ in range(k)])
    turn = torch.tensor([i for k in turns for i in range(k)])
    seq = torch.tensor([advantages[t] for t in traj.tolist()], dtype=torch.float64)
    inputs = CreditInputs(seq, traj, turn, torch.full_like(seq, rate), oracle_progress=torch.zeros_like(seq))
    assert torch.equal(estimate("agentopsd-oracle", inputs).advantages, estimate("grpo", inputs).advantages)


# ---- scripted ALFWorld play ----------------------------------------------------------------------------------
def _play(env, task_index: int, script: str, traj_id: int, group_id: int) -> Trajectory:
    """One episode: `script` says per turn 'e' (the expert's action) or 'w' (a wasted valid action: `look`),
    until the game is won or the script ends; each turn records the distances as the rollout does."""
    _, info = env.reset(options={"task_index": task_index})
    distance, turns, won = info["oracle_distance"], [], False
    for index, kind in enumerate(script):
        action = env.oracle_action() if kind == "e" else "look"
        _, reward, terminated, _, info = env.step(action)
        turns.append(Turn(index, [{"role": "user", "content": f"turn {index}"}], action, action,
                          bool(info["action_valid"]), "", float(reward), response_token_ids=[1, 2],
                          response_logprobs=[-0.1, -0.1],
                          info={ORACLE_BEFORE: distance, ORACLE_AFTER: info["oracle_distance"]}))
        distance, won = info["oracle_distance"], bool(info.get("won"))
        if terminated:
            break
    return Trajectory("ALFWorld-v0:easy", str(task_index), "pick_and_place_simple", group_id, traj_id, traj_id,
                      turns=turns, won=won)


@pytest.fixture(scope="module")
def scripted(fresh_cache_dir) -> list[Trajectory]:
    pytest.importorskip("textworld")
    from agentgym_opsd.environments.alfworld.env import ALFWorldEnv

    env = ALFWorldEnv(split="easy", max_turns=30)
    try:
        # two groups; in each, one rollout wins (expert steps with wasted ones between) and one does not
        return [_play(env, 0, "ewewewewewewewewewew", 0, 0), _play(env, 0, "wwewwwwe", 1, 0),
                _play(env, 21, "eweweeweweweweweewew", 2, 1), _play(env, 21, "wwwwewww", 3, 1)]
    finally:
        env.close()


def _oracle_credit(trajs: list[Trajectory]):
    batch = build_turn_batch(trajs, encode_prompt=lambda messages: [0])
    credit = batch_advantages(batch, torch.zeros(len(batch)), [torch.zeros(2)] * len(batch),
                              estimator="agentopsd-oracle", config=CreditConfig.PAPER, return_details=True)
    return batch, credit


def test_scripted_play_raw_evidence_and_credit_rank_progress_first(scripted) -> None:
    assert [t.won for t in scripted] == [True, False, True, False]
    batch, credit = _oracle_credit(scripted)
    evidence = credit.result.details["evidence"].tolist()
    advantage = credit.result.advantages.tolist()
    scores = []
    for row, r in enumerate(batch.rows):
        traj = scripted[r.traj_id]
        label = turn_progress(traj.turns[r.turn_id])
        assert label in (PROGRESS, WASTED)
        seq = float(credit.seq[batch.traj_index[row]])
        scores.append(cq.TurnScore(traj.won, len(traj.turns), label, True, seq,
                                   {"agentopsd-oracle": advantage[row] / seq, cq.EVIDENCE: evidence[row]}))
    labels = [s.label for s in scores]
    assert labels.count(PROGRESS) >= 6 and labels.count(WASTED) >= 6
    for won in (True, False):
        assert cq.evidence_auc(scores, won=won)[0] == 1.0  # raw e_k: every progress turn above every wasted one
    assert cq.split_auc(scores, "agentopsd-oracle", won=True)[0] > 0.95  # the belief keeps the ranking
    assert cq.split_auc(scores, "agentopsd-oracle", won=False)[0] > 0.95  # and blames the wasted turns


def test_an_environment_without_a_distance_is_refused(scripted) -> None:
    blind = [Trajectory(t.env_id, t.task_id, t.task_type, t.group_id, t.traj_id, t.seed,
                        turns=[Turn(u.index, u.prompt, u.response_text, u.action, u.action_valid, "", u.reward,
                                    response_token_ids=[1], response_logprobs=[-0.1]) for u in t.turns], won=t.won)
             for t in scripted]
    with pytest.raises(ValueError, match="oracle_distance"):
        _oracle_credit(blind)


def test_a_training_run_uses_it_without_a_teacher(tmp_path, fresh_cache_dir) -> None:
    pytest.importorskip("textworld")
    from agentgym_opsd.trainer.cli import main

    out = tmp_path / "run"
    assert main(["--config", "cpu-tiny", "trainer.total_steps=1", "trainer.backend=torch", "trainer.tensorboard=false",
                 "trainer.save_trajectories=true", "algorithm.estimator=agentopsd-oracle",
                 f"trainer.output_dir={out}"]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(m["teacher_rows"] == 0 for m in metrics if "teacher_rows" in m)  # no teacher pass ran
    lines = [json.loads(x) for x in (out / "credit" / "step_000001.jsonl").read_text().splitlines()]
    turns = [t for line in lines for t in line["turns"]]
    assert turns and all("evidence" in t and "belief" in t for t in turns)
