from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from agentgym_opsd.evaluation.metrics import (
    GroupStats,
    fit_horizon,
    group_stats,
    horizon_of,
    stats_by_task_type,
    success_difference_interval,
    wilson_interval,
)
from agentgym_opsd.records import Trajectory, Turn


def _traj(won: bool, task_type: str = "a", turns: int = 2, invalid: int = 0, horizon: int | None = None,
          error: str | None = None, score: float | None = None) -> Trajectory:
    t = Trajectory(env_id="x", task_id="t", task_type=task_type, group_id=0, traj_id=0, seed=0, won=won,
                   score=float(won) if score is None else score, error=error,
                   metadata={} if horizon is None else {"optimal_plan_length": horizon})
    t.turns = [Turn(index=i, prompt=[], response_text="", action="a", action_valid=i >= invalid, observation="",
                    reward=0.0) for i in range(turns)]
    return t


@given(st.integers(0, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_interval_contains_the_estimate_and_stays_in_unit_range(pair):
    k, n = pair
    low, high = wilson_interval(k, n)
    assert 0.0 <= low <= high <= 1.0
    if n:
        assert low - 1e-12 <= k / n <= high + 1e-12


def test_wilson_interval_known_value():
    low, high = wilson_interval(8, 10)
    assert math.isclose(low, 0.4902, abs_tol=1e-3) and math.isclose(high, 0.9433, abs_tol=1e-3)
    assert wilson_interval(0, 0) == (0.0, 1.0)


_counts = st.integers(1, 300).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))


@given(_counts, _counts)
def test_success_difference_interval_holds_the_difference_and_flips_with_the_arms(a, b):
    low, high = success_difference_interval(*a, *b)
    diff = a[0] / a[1] - b[0] / b[1]
    assert -1.0 - 1e-12 <= low <= diff + 1e-12 <= high + 2e-12 <= 1.0 + 3e-12
    flipped = success_difference_interval(*b, *a)
    assert math.isclose(flipped[0], -high, abs_tol=1e-12) and math.isclose(flipped[1], -low, abs_tol=1e-12)


def test_success_difference_interval_known_value():
    # Newcombe (1998), Table II, example (a): 56/70 vs 48/80, method 10
    low, high = success_difference_interval(56, 70, 48, 80)
    assert math.isclose(low, 0.0524, abs_tol=1e-3) and math.isclose(high, 0.3339, abs_tol=1e-3)
    # one episode apart out of 32 each: nowhere near telling the arms apart
    low, high = success_difference_interval(17, 32, 18, 32)
    assert low < -0.2 and high > 0.2


def test_group_stats_count_infrastructure_failures_as_failures_and_invalid_per_turn():
    trajs = [_traj(True, turns=4, invalid=1), _traj(False, turns=2, invalid=2), _traj(True, error="boom", turns=2)]
    s = group_stats(trajs)
    assert s.episodes == 3 and s.successes == 1 and math.isclose(s.success_rate, 1 / 3)
    assert math.isclose(s.score_mean, 1 / 3)  # the errored episode's score does not count either
    assert math.isclose(s.turns_mean, 8 / 3) and math.isclose(s.invalid_action_rate, 3 / 8)
    assert s.failed_episodes == 1
    down = group_stats([_traj(False, error="down")])
    assert (down.episodes, down.successes, down.success_rate, down.failed_episodes) == (1, 0, 0.0, 1)
    assert group_stats([]) == GroupStats()
    by_type = stats_by_task_type([_traj(True, "b"), _traj(False, "a"), _traj(True, "")])
    assert list(by_type) == ["(none)", "a", "b"]


def test_horizon_slope_in_points_per_turn():
    # success 100% at horizon 2, 50% at 4, 0% at 6: exactly -25 points per extra turn.
    trajs = [_traj(True, horizon=2), _traj(True, horizon=2), _traj(True, horizon=4), _traj(False, horizon=4),
             _traj(False, horizon=6), _traj(False, horizon=6), _traj(True)]
    fit = fit_horizon(trajs)
    assert fit.episodes_with_horizon == 6
    assert math.isclose(fit.slope_points_per_turn, -25.0) and math.isclose(fit.intercept_points, 150.0)
    assert fit.points == {2: (2, 1.0), 4: (2, 0.5), 6: (2, 0.0)}
    assert fit_horizon([_traj(True, horizon=3)]).slope_points_per_turn is None


def test_horizon_keys_in_order():
    t = _traj(True)
    assert horizon_of(t) is None
    t.metadata = {"num_hops": 2, "oracle_turns": 5}
    assert horizon_of(t) == 2
    t.metadata = {"oracle_turns": 5, "optimal_plan_length": True}  # a bool is not a length
    assert horizon_of(t) == 5
