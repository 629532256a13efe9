"""Credit quality (`agentgym_opsd.evaluation.credit_quality`, `benchmarks/bench_credit_quality.py`): the AUC
helper by hand (ties included), turn labels, the summary, a run's own records, and a tiny end-to-end run
(noisy oracle on ALFWorld, tiny random model, seconds)."""

from __future__ import annotations

import json
import math

import pytest
from benchmark_scripts import load_benchmark

from agentgym_opsd.evaluation import credit_quality as cq
from agentgym_opsd.records import Trajectory, Turn, save_jsonl

bcq = load_benchmark("bench_credit_quality")


@pytest.mark.parametrize(("pos", "neg", "expected"), [
    ([1.0], [0.0], 1.0),
    ([0.0], [1.0], 0.0),
    ([1.0], [1.0], 0.5),  # a tie counts half
    ([1.0, 2.0], [1.0, 0.0], 3.5 / 4),  # (1,1) tie, (1,0), (2,1), (2,0)
    ([3.0, 1.0, 2.0], [2.0, 2.0], (0 + 0.5 + 0.5 + 1 + 1 + 0) / 6),  # 3 > both; 2 ties both; 1 below both
    ([0.5] * 4, [0.5] * 3, 0.5),  # all tied: GRPO's constant multiplier
])
def test_auc_by_hand(pos: list[float], neg: list[float], expected: float) -> None:
    assert cq.auc(pos, neg) == pytest.approx(expected)
    assert cq.auc(neg, pos) == pytest.approx(1.0 - expected)  # swapping the sides mirrors it


def test_auc_of_an_empty_side_is_nan() -> None:
    assert math.isnan(cq.auc([], [1.0]))
    assert math.isnan(cq.auc([1.0], []))


def _turn(before: int | None, after: int | None, valid: bool = True, recorded: bool = True) -> Turn:
    info = {"oracle_distance_before": before, "oracle_distance_after": after} if recorded else {}
    return Turn(0, [], "", "a", valid, "", 0.0, info=info)


def test_turn_labels() -> None:
    assert cq.turn_label(_turn(3, 2)) == cq.PROGRESS
    assert cq.turn_label(_turn(3, 3)) == cq.WASTED
    assert cq.turn_label(_turn(3, 4)) == cq.WASTED
    assert cq.turn_label(_turn(3, 3, valid=False)) == cq.WASTED
    assert cq.turn_label(_turn(1, None)) == cq.WASTED  # a wrong final answer: the goal is out of reach
    assert cq.turn_label(_turn(1, 0)) == cq.PROGRESS
    assert cq.turn_label(_turn(0, 0, recorded=False)) is None


def test_horizon_buckets() -> None:
    assert [cq.horizon_bucket(h, (4, 7)) for h in (1, 4, 5, 7, 8, 50)] == ["1-4", "1-4", "5-7", "5-7", "8+", "8+"]


def test_summary_signs_and_grpo() -> None:
    """In won trajectories progress should get the larger multiplier, in lost ones the wasted turns."""
    S = cq.TurnScore
    scores = [
        S(True, 3, cq.PROGRESS, True, 1.0, {"grpo": 1.0, "good": 1.2, "bad": 0.8}),
        S(True, 3, cq.WASTED, True, 1.0, {"grpo": 1.0, "good": 0.8, "bad": 1.2}),
        S(False, 9, cq.PROGRESS, True, -1.0, {"grpo": 1.0, "good": 0.8, "bad": 1.2}),
        S(False, 9, cq.WASTED, False, -1.0, {"grpo": 1.0, "good": 1.2, "bad": 0.8}),
        S(False, 9, None, True, -1.0, {"grpo": 1.0, "good": 5.0, "bad": 5.0}),  # unlabelled: ignored
        S(True, 3, cq.PROGRESS, True, 0.0, {}),  # A_seq = 0: no multiplier, ignored
    ]
    s = cq.summarise(scores, ("grpo", "good", "bad"), horizon_edges=(4, 7))
    e = s["estimators"]
    assert e["grpo"]["success"]["auc"] == 0.5 and e["grpo"]["failure"]["auc"] == 0.5
    assert e["good"]["success"]["auc"] == 1.0 and e["good"]["failure"]["auc"] == 1.0
    assert e["bad"]["success"]["auc"] == 0.0 and e["bad"]["failure"]["auc"] == 0.0
    assert (e["good"]["success"]["progress"], e["good"]["success"]["wasted"]) == (1, 1)
    assert s["buckets"] == ["1-4", "8+"]
    assert e["good"]["success_by_horizon"]["1-4"]["auc"] == 1.0
    assert math.isnan(e["good"]["success_by_horizon"]["8+"]["auc"])
    assert math.isnan(e["good"]["failure"]["auc_valid_only"])  # the lost trajectory's wasted turn was invalid


def test_tiny_run_end_to_end(tmp_path, fresh_cache_dir) -> None:
    pytest.importorskip("textworld")
    trainer = bcq.make_trainer("cpu-tiny", ["model.name_or_path=tiny-random", "env.max_turns=8"], str(tmp_path),
                               chunk_tasks=2, group_size=2)
    try:
        policy = bcq.NoisyOraclePolicy(0.7, trainer.session.trained.tokenizer, seed=0)
        trainer.session.envs[0].runner.hint_level = "goal"
        run, scores = bcq.run_policy(trainer, "noisy-oracle", policy, num_tasks=2, group_size=2, chunk_tasks=2,
                                     contexts=("skills", "hint"))
    finally:
        trainer.close()
    assert set(run.by_context) == {"skills", "hint"} and run.summary is run.by_context["skills"]
    assert "teacher context" in bcq.format_table(run)
    assert run.episodes == 4 and run.turns == len(scores) > 0
    assert run.labelled_turns == run.turns  # ALFWorld reports the oracle distance on every turn
    assert set(run.summary["estimators"]) == set(bcq.ESTIMATORS)
    for s in scores:
        if s.multiplier:
            assert s.multiplier["grpo"] == pytest.approx(1.0)
            assert set(s.multiplier) == set(bcq.ESTIMATORS)
    for outcome in ("success", "failure"):
        value = run.summary["estimators"]["grpo"][outcome]["auc"]
        assert math.isnan(value) or value == 0.5
    json.dumps(run.summary)  # the JSON record takes it as is
    table = bcq.format_table(run)
    assert "agentopsd+gigpo" in table


def test_a_runs_own_records_give_the_auc_of_its_valid_turns(tmp_path) -> None:
    """`scores_from_run` joins trajectories and credit lines by trajectory and turn; invalid turns (their Ã
    carries the penalty push) and A_seq = 0 trajectories are left out; the multiplier is Ã_k / A_seq."""
    won = Trajectory("e", "t0", "x", 0, 0, 0, turns=[_turn(3, 2), _turn(2, 2), _turn(2, 1, valid=False)], won=True)
    lost = Trajectory("e", "t0", "x", 0, 1, 1, turns=[_turn(3, 3), _turn(3, 2)])
    flat = Trajectory("e", "t1", "x", 1, 2, 2, turns=[_turn(3, 3)])
    save_jsonl([won, lost, flat], tmp_path / "trajectories" / "step_000001.jsonl")
    lines = [
        {"estimator": "agentopsd", "traj_id": 0, "seq_advantage": 1.0,
         "turns": [{"turn": 0, "advantage": 1.2}, {"turn": 1, "advantage": 0.8}, {"turn": 2, "advantage": 5.0}]},
        {"estimator": "agentopsd", "traj_id": 1, "seq_advantage": -1.0,
         "turns": [{"turn": 0, "advantage": -1.2}, {"turn": 1, "advantage": -0.8}]},
        {"estimator": "agentopsd", "traj_id": 2, "seq_advantage": 0.0, "turns": [{"turn": 0, "advantage": 0.0}]},
    ]
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "step_000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    estimator, scores = cq.scores_from_run(tmp_path)
    assert estimator == "agentopsd" and len(scores) == 4
    assert sorted(s.multiplier["agentopsd"] for s in scores) == pytest.approx([0.8, 0.8, 1.2, 1.2])
    result = cq.run_credit_auc(tmp_path)
    assert result is not None
    assert result["success"] == {"auc": 1.0, "progress": 1, "wasted": 1}  # progress got the larger share
    assert result["failure"] == {"auc": 1.0, "progress": 1, "wasted": 1}  # the wasted turn the larger blame
    assert "evidence" not in result  # no e_k recorded (e.g. GRPO): no teacher AUC
    assert cq.run_credit_auc(tmp_path / "missing") is None


def test_a_runs_own_records_give_the_auc_of_the_raw_evidence(tmp_path) -> None:
    """The teacher's e_k, before the estimator: P(e_progress > e_wasted) in won and in lost trajectories alike.
    Here the estimator blames the right turn of the lost trajectory while the teacher preferred the wasted one:
    the two AUCs tell the estimator's work from the teacher's."""
    won = Trajectory("e", "t0", "x", 0, 0, 0, turns=[_turn(3, 2), _turn(2, 2)], won=True)
    lost = Trajectory("e", "t0", "x", 0, 1, 1, turns=[_turn(3, 3), _turn(3, 2)])
    save_jsonl([won, lost], tmp_path / "trajectories" / "step_000001.jsonl")
    lines = [
        {"estimator": "agentopsd", "traj_id": 0, "seq_advantage": 1.0,
         "turns": [{"turn": 0, "evidence": 0.5, "advantage": 1.2}, {"turn": 1, "evidence": -0.2, "advantage": 0.8}]},
        {"estimator": "agentopsd", "traj_id": 1, "seq_advantage": -1.0,
         "turns": [{"turn": 0, "evidence": 0.3, "advantage": -1.2}, {"turn": 1, "evidence": -0.1, "advantage": -0.8}]},
    ]
    (tmp_path / "credit").mkdir()
    (tmp_path / "credit" / "step_000001.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = cq.run_credit_auc(tmp_path)
    assert result is not None
    assert result["failure"]["auc"] == 1.0  # the estimator's credit: the wasted turn the larger blame
    assert result["evidence"] == {"success": {"auc": 1.0, "progress": 1, "wasted": 1},
                                  "failure": {"auc": 0.0, "progress": 1, "wasted": 1}}
