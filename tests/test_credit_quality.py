"""benchmarks/bench_credit_quality.py: the AUC helper by hand (ties included), turn labels, the summary, and a
tiny end-to-end run (noisy oracle on ALFWorld, tiny random model, seconds)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from agentgym_opsd.records import Turn

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_credit_quality.py"
_spec = importlib.util.spec_from_file_location("bench_credit_quality", _PATH)
assert _spec is not None and _spec.loader is not None
bcq = importlib.util.module_from_spec(_spec)
sys.modules["bench_credit_quality"] = bcq
_spec.loader.exec_module(bcq)


@pytest.mark.parametrize(("pos", "neg", "expected"), [
    ([1.0], [0.0], 1.0),
    ([0.0], [1.0], 0.0),
    ([1.0], [1.0], 0.5),  # a tie counts half
    ([1.0, 2.0], [1.0, 0.0], 3.5 / 4),  # (1,1) tie, (1,0), (2,1), (2,0)
    ([3.0, 1.0, 2.0], [2.0, 2.0], (0 + 0.5 + 0.5 + 1 + 1 + 0) / 6),  # 3 > both; 2 ties both; 1 below both
    ([0.5] * 4, [0.5] * 3, 0.5),  # all tied: GRPO's constant multiplier
])
def test_auc_by_hand(pos: list[float], neg: list[float], expected: float) -> None:
    assert bcq.auc(pos, neg) == pytest.approx(expected)
    assert bcq.auc(neg, pos) == pytest.approx(1.0 - expected)  # swapping the sides mirrors it


def test_auc_of_an_empty_side_is_nan() -> None:
    assert math.isnan(bcq.auc([], [1.0]))
    assert math.isnan(bcq.auc([1.0], []))


def _turn(before: int | None, after: int | None, valid: bool = True, recorded: bool = True) -> Turn:
    info = {"oracle_distance_before": before, "oracle_distance_after": after} if recorded else {}
    return Turn(0, [], "", "a", valid, "", 0.0, info=info)


def test_turn_labels() -> None:
    assert bcq.turn_label(_turn(3, 2)) == bcq.PROGRESS
    assert bcq.turn_label(_turn(3, 3)) == bcq.WASTED
    assert bcq.turn_label(_turn(3, 4)) == bcq.WASTED
    assert bcq.turn_label(_turn(3, 3, valid=False)) == bcq.WASTED
    assert bcq.turn_label(_turn(1, None)) == bcq.WASTED  # a wrong final answer: the goal is out of reach
    assert bcq.turn_label(_turn(1, 0)) == bcq.PROGRESS
    assert bcq.turn_label(_turn(0, 0, recorded=False)) is None


def test_horizon_buckets() -> None:
    assert [bcq.horizon_bucket(h, (4, 7)) for h in (1, 4, 5, 7, 8, 50)] == ["1-4", "1-4", "5-7", "5-7", "8+", "8+"]


def test_summary_signs_and_grpo() -> None:
    """In won trajectories progress should get the larger multiplier, in lost ones the wasted turns."""
    S = bcq.TurnScore
    scores = [
        S(True, 3, bcq.PROGRESS, True, 1.0, {"grpo": 1.0, "good": 1.2, "bad": 0.8}),
        S(True, 3, bcq.WASTED, True, 1.0, {"grpo": 1.0, "good": 0.8, "bad": 1.2}),
        S(False, 9, bcq.PROGRESS, True, -1.0, {"grpo": 1.0, "good": 0.8, "bad": 1.2}),
        S(False, 9, bcq.WASTED, False, -1.0, {"grpo": 1.0, "good": 1.2, "bad": 0.8}),
        S(False, 9, None, True, -1.0, {"grpo": 1.0, "good": 5.0, "bad": 5.0}),  # unlabelled: ignored
        S(True, 3, bcq.PROGRESS, True, 0.0, {}),  # A_seq = 0: no multiplier, ignored
    ]
    s = bcq.summarise(scores, ("grpo", "good", "bad"), horizon_edges=(4, 7))
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
        policy = bcq.NoisyOraclePolicy(0.7, trainer.tokenizer, seed=0)
        trainer.runner.hint_level = "goal"
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
