"""Evaluation metrics over finished trajectories: success with a Wilson interval, score, turns, invalid
actions, the per-task-type breakdown and horizon sensitivity.

Everything here is a pure function of `Trajectory` records (no environment, no model), so reports can be
rebuilt from a saved `episodes.jsonl` at any time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentgym_opsd.records import Trajectory, summarize

__all__ = [
    "HORIZON_KEYS",
    "GroupStats",
    "HorizonFit",
    "fit_horizon",
    "group_stats",
    "horizon_of",
    "paired_success_difference_interval",
    "stats_by_task_type",
    "success_difference_interval",
    "wilson_interval",
]

HORIZON_KEYS: tuple[str, ...] = ("optimal_plan_length", "num_hops", "oracle_turns")
"""Trajectory.metadata keys that give a task's horizon, first found wins: ALFWorld's optimal plan length,
Search-QA's number of hops, or the number of turns the oracle needed (filled in by the suite)."""


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% for z = 1.96); (0, 1) when there are no trials.

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0% and 100% success.
    """
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, trials={trials}], got {successes}")
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def success_difference_interval(successes_a: int, trials_a: int, successes_b: int, trials_b: int,
                                z: float = 1.96) -> tuple[float, float]:
    """95% interval of the difference of two independent success rates, a − b (Newcombe's hybrid score
    method, from the two Wilson intervals).

    Two arms evaluated on a few dozen episodes each differ by a few episodes by chance alone; this says how
    large a difference the evaluation can tell from zero. It stays inside [−1, 1] and behaves at 0% and 100%.
    """
    return _hybrid_score_interval(successes_a, trials_a, successes_b, trials_b, 0.0, z)


def paired_success_difference_interval(both: int, only_a: int, only_b: int, neither: int,
                                       z: float = 1.96) -> tuple[float, float]:
    """95% interval of a − b for two success rates measured on the same episodes (Newcombe 1998, method 10):
    the hybrid score interval with the two outcomes' correlation φ. `both` episodes were won by a and b,
    `only_a` by a alone, `only_b` by b alone, `neither` by neither. Shared episodes that go together (φ > 0)
    narrow the interval below the independent one; the discordant episodes are what it measures. As Newcombe
    does, a positive φ is shrunk by half an episode (AD − BC − n/2), which keeps the coverage at 95%."""
    counts = (both, only_a, only_b, neither)
    if min(counts) < 0 or sum(counts) == 0:
        raise ValueError(f"counts: expected non-negative with at least one episode, got {counts}")
    n = sum(counts)
    wins_a, wins_b = both + only_a, both + only_b
    margins = wins_a * (n - wins_a) * wins_b * (n - wins_b)
    cross = both * neither - only_a * only_b
    if cross > 0:
        cross = max(cross - n / 2, 0.0)
    phi = cross / math.sqrt(margins) if margins else 0.0
    return _hybrid_score_interval(wins_a, n, wins_b, n, phi, z)


def _hybrid_score_interval(successes_a: int, trials_a: int, successes_b: int, trials_b: int, phi: float,
                           z: float) -> tuple[float, float]:
    """Newcombe's interval for p_a − p_b from the two Wilson intervals, with correlation φ (0: independent)."""
    p_a, p_b = successes_a / max(trials_a, 1), successes_b / max(trials_b, 1)
    low_a, high_a = wilson_interval(successes_a, trials_a, z)
    low_b, high_b = wilson_interval(successes_b, trials_b, z)
    diff = p_a - p_b
    below = (p_a - low_a) ** 2 - 2 * phi * (p_a - low_a) * (high_b - p_b) + (high_b - p_b) ** 2
    above = (high_a - p_a) ** 2 - 2 * phi * (high_a - p_a) * (p_b - low_b) + (p_b - low_b) ** 2
    return diff - math.sqrt(max(below, 0.0)), diff + math.sqrt(max(above, 0.0))


@dataclass
class GroupStats:
    """Aggregates over a set of episodes.

    `episodes` counts every episode; `success_rate` is the fraction of them won, `ci_low`/`ci_high` its Wilson
    95% interval; `score_mean` mean partial credit in [0, 1]; `turns_mean` mean turns per episode;
    `invalid_action_rate` invalid actions / all turns. `failed_episodes` ended with an infrastructure error
    (environment crash or hang, policy endpoint down) even after retries: by the rule of `records.summarize`
    they count as failures (not won, score 0) in every statistic above, and are reported here on their own.
    """

    episodes: int = 0
    successes: int = 0
    success_rate: float = 0.0
    ci_low: float = 0.0
    ci_high: float = 1.0
    score_mean: float = 0.0
    turns_mean: float = 0.0
    invalid_action_rate: float = 0.0
    failed_episodes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_stats(trajectories: Sequence[Trajectory]) -> GroupStats:
    s = summarize(trajectories)
    if s.episodes == 0:
        return GroupStats()
    low, high = wilson_interval(s.successes, s.episodes)
    return GroupStats(episodes=s.episodes, successes=s.successes, success_rate=s.success_rate, ci_low=low,
                      ci_high=high, score_mean=s.score_mean, turns_mean=s.turns_mean,
                      invalid_action_rate=s.invalid_action_rate, failed_episodes=s.errors)


def stats_by_task_type(trajectories: Sequence[Trajectory]) -> dict[str, GroupStats]:
    """Task type -> stats, sorted by task type ("" shows as "(none)")."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.task_type or "(none)", []).append(t)
    return {k: group_stats(groups[k]) for k in sorted(groups)}


def horizon_of(traj: Trajectory) -> int | None:
    """The task's horizon (see HORIZON_KEYS), or None when the trajectory does not say."""
    for key in HORIZON_KEYS:
        value = traj.metadata.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            return int(value)
    return None


@dataclass
class HorizonFit:
    """Success against horizon. `points` maps horizon -> (episodes, success rate); `slope_points_per_turn`
    is the least-squares slope of success in percentage points per extra turn of horizon (the paper's
    "points lost per extra turn" is its negative side), None with fewer than two distinct horizons;
    `intercept_points` the fitted success at horizon 0, in points."""

    points: dict[int, tuple[int, float]] = field(default_factory=dict)
    slope_points_per_turn: float | None = None
    intercept_points: float | None = None
    episodes_with_horizon: int = 0


def fit_horizon(trajectories: Sequence[Trajectory]) -> HorizonFit:
    """Fit success (0/100 per episode) = a + b * horizon over every episode that has a horizon.

    Fitting on episodes, not on the per-horizon means, weights each horizon by how many episodes it has.
    """
    # an errored episode is a failure here too (`records.summarize`)
    pairs = [(h, 100.0 * t.succeeded) for t in trajectories if (h := horizon_of(t)) is not None]
    fit = HorizonFit(episodes_with_horizon=len(pairs))
    by_h: dict[int, list[float]] = {}
    for h, s in pairs:
        by_h.setdefault(h, []).append(s)
    fit.points = {h: (len(v), sum(v) / len(v) / 100.0) for h, v in sorted(by_h.items())}
    if len(by_h) < 2:
        return fit
    n = len(pairs)
    mean_x = sum(h for h, _ in pairs) / n
    mean_y = sum(s for _, s in pairs) / n
    sxx = sum((h - mean_x) ** 2 for h, _ in pairs)
    sxy = sum((h - mean_x) * (s - mean_y) for h, s in pairs)
    fit.slope_points_per_turn = sxy / sxx
    fit.intercept_points = mean_y - fit.slope_points_per_turn * mean_x
    return fit
