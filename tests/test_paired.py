"""The paired-difference math behind the study's forest plot (`agentgym_opsd.evaluation.paired`): the t quantile
against published values, the interval's symmetries, its coverage in simulation, and the minimality of what a
±3-point answer is said to need."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentgym_opsd.evaluation.metrics import paired_success_difference_interval, success_difference_interval
from agentgym_opsd.evaluation.paired import (
    Z_975,
    SeedPair,
    episodes_for_target,
    mcnemar_p,
    paired_difference,
    paired_episodes,
    paired_spread,
    seeds_for_target,
    t_quantile_975,
)


def _pairs(draw_counts: list[tuple[int, int]], episodes: int) -> list[SeedPair]:
    return [SeedPair(seed, arm, episodes, base, episodes) for seed, (arm, base) in enumerate(draw_counts)]


@st.composite
def seed_pairs(draw, min_seeds: int = 1, max_seeds: int = 6) -> list[SeedPair]:
    episodes = draw(st.integers(1, 200))
    wins = st.integers(0, episodes)
    counts = draw(st.lists(st.tuples(wins, wins), min_size=min_seeds, max_size=max_seeds))
    return _pairs(counts, episodes)


@pytest.mark.parametrize(("dof", "exact"), [(1, 12.7062), (2, 4.3027), (10, 2.2281), (30, 2.0423), (40, 2.0211),
                                            (60, 2.0003), (120, 1.9799), (1000, 1.9623)])
def test_t_quantile_matches_published_values(dof, exact):
    assert t_quantile_975(dof) == pytest.approx(exact, abs=1.5e-4)


@given(st.integers(1, 5000))
def test_t_quantile_falls_towards_the_normal_one(dof):
    assert Z_975 < t_quantile_975(dof + 1) < t_quantile_975(dof)


def test_t_quantile_refuses_zero_degrees_of_freedom():
    with pytest.raises(ValueError, match="dof"):
        t_quantile_975(0)


@given(seed_pairs())
def test_swapping_the_arms_mirrors_the_interval(pairs):
    swapped = [SeedPair(p.seed, p.base_wins, p.base_episodes, p.arm_wins, p.arm_episodes) for p in pairs]
    a, b = paired_difference(pairs), paired_difference(swapped)
    assert b.mean == pytest.approx(-a.mean, abs=1e-12)
    assert (b.low, b.high) == pytest.approx((-a.high, -a.low), abs=1e-12)
    assert a.method == b.method
    assert {a.verdict, b.verdict} in ({"cannot tell"}, {"helps", "hurts"})


@given(seed_pairs(), st.randoms(use_true_random=False))
def test_the_order_of_the_seeds_does_not_matter(pairs, rng):
    shuffled = list(pairs)
    rng.shuffle(shuffled)
    a, b = paired_difference(pairs), paired_difference(shuffled)
    assert (b.mean, b.low, b.high, b.verdict) == pytest.approx((a.mean, a.low, a.high, a.verdict), abs=1e-12)


@given(seed_pairs())
def test_the_interval_holds_the_mean_and_only_a_t_interval_decides(pairs):
    result = paired_difference(pairs)
    assert result.low <= result.mean <= result.high
    diffs = [p.difference for p in pairs]
    if len(pairs) >= 3 and statistics.stdev(diffs) > 0:
        half = t_quantile_975(len(pairs) - 1) * statistics.stdev(diffs) / math.sqrt(len(pairs))
        assert result.method == "t over seeds"
        assert result.half_width == pytest.approx(half, rel=1e-9)
        expected = "helps" if result.low > 0 else "hurts" if result.high < 0 else "cannot tell"
        assert result.verdict == expected
    else:
        assert result.method == "pooled episodes"
        assert result.verdict == "cannot tell"


def test_one_seed_is_newcombes_interval_of_its_two_runs():
    result = paired_difference([SeedPair(0, 20, 48, 15, 48)])
    assert (result.low, result.high) == pytest.approx(success_difference_interval(20, 48, 15, 48))
    assert result.mean == pytest.approx(5 / 48)


def test_the_t_interval_covers_the_true_difference_95_percent_of_the_time():
    """Three seeds, each with its own seed effect (sd 5 points) and binomial noise over 48 shared-size episodes:
    the interval should hold the true difference (+5 points) in about 95% of 4,000 simulated studies."""
    rng = random.Random(0)
    truth, hits, trials = 0.05, 0, 4000
    for _ in range(trials):
        pairs = []
        for seed in range(3):
            base_rate = min(max(rng.gauss(0.5, 0.05), 0.0), 1.0)
            arm_rate = min(max(base_rate + truth + rng.gauss(0.0, 0.05), 0.0), 1.0)
            pairs.append(SeedPair(seed, sum(rng.random() < arm_rate for _ in range(48)), 48,
                                  sum(rng.random() < base_rate for _ in range(48)), 48))
        result = paired_difference(pairs)
        hits += result.low <= truth <= result.high
    assert 0.93 <= hits / trials <= 0.97


@settings(max_examples=200)
@given(st.floats(0.001, 0.5), st.floats(0.005, 0.2))
def test_seeds_for_target_is_the_fewest_that_suffice(spread, target):
    k = seeds_for_target(spread, target)
    assert k is not None and k >= 2
    assert t_quantile_975(k - 1) * spread / math.sqrt(k) <= target
    if k > 2:
        assert t_quantile_975(k - 2) * spread / math.sqrt(k - 1) > target
    assert seeds_for_target(spread * 1.5, target) >= k


def test_seeds_for_target_without_a_spread_is_unknown():
    assert seeds_for_target(None, 0.03) is None
    with pytest.raises(ValueError, match="target"):
        seeds_for_target(0.1, 0.0)


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0.005, 0.2))
def test_episodes_for_target_is_the_fewest_that_suffice(rate_a, rate_b, target):
    n = episodes_for_target(rate_a, rate_b, target)
    variance = rate_a * (1 - rate_a) + rate_b * (1 - rate_b)
    assert Z_975 * math.sqrt(variance / n) <= target * (1 + 1e-9)
    if n > 1:
        assert Z_975 * math.sqrt(variance / (n - 1)) > target * (1 - 1e-9)


def test_episodes_for_target_by_hand():
    # 1.96² · (0.4·0.6 + 0.4·0.6) / 0.03² = 2048.7
    assert episodes_for_target(0.4, 0.4, 0.03) == 2049


def test_spread_comes_from_the_pairs_else_from_the_baselines_seeds():
    assert paired_spread([0.0, 0.1], [0.3]) == (pytest.approx(statistics.stdev([0.0, 0.1])), "paired seeds")
    spread, source = paired_spread([0.1], [0.3125, 0.4167])
    assert spread == pytest.approx(math.sqrt(2) * statistics.stdev([0.3125, 0.4167]))
    assert source == "baseline seeds × √2"
    assert paired_spread([0.1], [0.3]) == (None, None)
    assert paired_spread([0.1, 0.1], []) == (None, None)  # no spread measured is not "no spread"


def test_bad_pairs_are_refused_by_name():
    with pytest.raises(ValueError, match="arm_wins"):
        SeedPair(0, 49, 48, 10, 48)
    with pytest.raises(ValueError, match="base_episodes"):
        SeedPair(0, 1, 48, 0, 0)
    with pytest.raises(ValueError, match="each seed once"):
        paired_difference([SeedPair(0, 1, 4, 1, 4), SeedPair(0, 2, 4, 1, 4)])
    with pytest.raises(ValueError, match="at least one seed"):
        paired_difference([])


# ---- episode by episode: before / after on the same held-out episodes -----------------------------------------
_counts = st.tuples(*[st.integers(0, 60)] * 4).filter(lambda c: sum(c) > 0)


@given(_counts)
@settings(max_examples=200, deadline=None)
def test_the_paired_interval_holds_the_difference_and_mirrors(counts):
    both, only_a, only_b, neither = counts
    low, high = paired_success_difference_interval(both, only_a, only_b, neither)
    diff = (only_a - only_b) / sum(counts)
    assert -1 - 1e-9 <= low <= diff + 1e-12 and diff - 1e-12 <= high <= 1 + 1e-9
    mirrored = paired_success_difference_interval(both, only_b, only_a, neither)
    assert mirrored == pytest.approx((-high, -low), abs=1e-12)


@given(st.integers(1, 40), st.integers(0, 10), st.integers(0, 10), st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_outcomes_that_go_together_narrow_the_interval_below_the_independent_one(both, only_a, only_b, neither):
    """With φ >= 0 (shared episodes won and lost together) the paired interval is no wider than Newcombe's
    interval for two independent samples of the same rates."""
    n = both + only_a + only_b + neither
    if both * neither < only_a * only_b:
        return
    low, high = paired_success_difference_interval(both, only_a, only_b, neither)
    ind_low, ind_high = success_difference_interval(both + only_a, n, both + only_b, n)
    assert high - low <= ind_high - ind_low + 1e-12


def test_the_paired_interval_covers_the_true_difference_95_percent_of_the_time():
    """Simulated before / after evaluations of 96 shared episodes whose outcomes go together (an episode won
    before is won after with 0.8, a lost one with 0.15): the interval holds the true difference in about 95%
    of 2000 draws, and is narrower on average than the independent samples' interval."""
    rng = random.Random(0)
    p_before, keep, gain = 0.4, 0.8, 0.15
    truth = p_before * keep + (1 - p_before) * gain - p_before
    covered, width, width_independent = 0, 0.0, 0.0
    for _ in range(2000):
        counts = [0, 0, 0, 0]  # both, after only, before only, neither
        for _ in range(96):
            before = rng.random() < p_before
            after = rng.random() < (keep if before else gain)
            counts[(0 if after else 2) if before else (1 if after else 3)] += 1
        low, high = paired_success_difference_interval(*counts)
        covered += low <= truth <= high
        width += high - low
        ind = success_difference_interval(counts[0] + counts[1], 96, counts[0] + counts[2], 96)
        width_independent += ind[1] - ind[0]
    assert 0.93 <= covered / 2000 <= 0.975
    assert width < 0.8 * width_independent


@given(st.integers(0, 30), st.integers(0, 30))
def test_mcnemar_is_symmetric_and_a_probability(b, c):
    p = mcnemar_p(b, c)
    assert 0 < p <= 1 and p == mcnemar_p(c, b)
    assert (p == 1.0) == (abs(b - c) <= 1)  # the discordant episodes split as evenly as they can


def test_mcnemar_by_hand():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(0, 6) == pytest.approx(2 / 64)  # six changes all one way
    assert mcnemar_p(1, 9) == pytest.approx(2 * 11 / 1024)


def test_paired_episodes_matches_by_spec_and_seed():
    before = [{"env_spec": "A", "seed": s, "won": s < 12} for s in range(20)]
    after = [{"env_spec": "A", "seed": s, "won": s >= 6} for s in range(4, 24)]  # 16 shared: seeds 4..19
    other = [{"env_spec": "B", "seed": s, "won": True} for s in range(20)]
    pe = paired_episodes(before + other, after)
    assert pe is not None
    assert (pe.episodes, pe.won_both, pe.first_only, pe.second_only, pe.neither) == (16, 6, 2, 8, 0)
    assert pe.difference == pytest.approx(6 / 16) and pe.mcnemar_p == pytest.approx(mcnemar_p(2, 8))
    assert paired_episodes(before, other) is None
    assert paired_episodes(before, before).verdict == "cannot tell"


def test_seeds_that_kept_their_episodes_get_the_paired_interval():
    """The same rates, with and without the shared-episode counts: the paired interval (outcomes that go together)
    is the narrower one, and one seed without counts sends the row back to the independent interval."""
    shared = (30, 6, 3, 57)  # 96 episodes: arm 36 wins, base 33
    with_counts = paired_difference([SeedPair(0, 36, 96, 33, 96, shared)])
    without = paired_difference([SeedPair(0, 36, 96, 33, 96)])
    assert with_counts.method == "paired episodes" and without.method == "pooled episodes"
    assert with_counts.mean == without.mean and with_counts.verdict == "cannot tell"
    assert with_counts.high - with_counts.low < 0.7 * (without.high - without.low)
    mixed = paired_difference([SeedPair(0, 36, 96, 33, 96, shared), SeedPair(1, 30, 96, 33, 96)])
    assert mixed.method == "pooled episodes"
    with pytest.raises(ValueError, match="shared"):
        SeedPair(0, 36, 96, 33, 96, (1, 2, 3))
