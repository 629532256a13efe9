"""Paired differences in success between two training arms, and what a study of their size can resolve.

Two arms trained from one warm start with the same RL seeds and evaluated on the same held-out episodes give one
`SeedPair` per seed; result files keep rates and counts, not per-episode outcomes. `paired_difference`: with three
or more seeds, a t interval over the seeds' differences, whose spread carries both noise sources (RL seed and
episodes); with fewer, Newcombe's interval for the episodes pooled over the seeds ("paired episodes" where every
seed kept its shared episodes, `SeedPair.shared`, else "pooled episodes"). That one cannot see the seed spread, so
it bounds episode noise only and never reads "helps" or "hurts". `paired_episodes` compares two evaluations of one
run episode by episode (Newcombe's paired interval, McNemar's exact test). For a ±target answer, `seeds_for_target`
is the smallest k >= 2 with t(0.975, k−1)·s/√k <= target (s from `paired_spread`: the paired seeds, else √2 × the
baseline's seed spread) and `episodes_for_target` is n = z²·(p_a(1−p_a) + p_b(1−p_b)) / target² per arm.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agentgym_opsd.evaluation.metrics import paired_success_difference_interval, success_difference_interval

__all__ = ["MIN_SEEDS_FOR_T", "PairedDifference", "PairedEpisodes", "SeedPair", "episodes_for_target",
           "mcnemar_p", "paired_difference", "paired_episodes", "paired_spread", "seeds_for_target", "t_quantile_975"]

Z_975 = 1.959963984540054
MIN_SEEDS_FOR_T = 3
"""Below three seeds the spread of the paired differences has at most one degree of freedom (t = 12.7)."""

# Student's t, 0.975 quantile, degrees of freedom 1..30 (four decimals, as printed in every t table).
_T_975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788,
          2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
          2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t_quantile_975(dof: int) -> float:
    """The 0.975 quantile of Student's t with `dof` degrees of freedom (a 95% two-sided interval's multiplier):
    the table up to 30, then the Cornish–Fisher expansion in 1/dof (within 1e-4 of the exact value there)."""
    if dof < 1:
        raise ValueError(f"dof: expected >= 1, got {dof}")
    if dof <= len(_T_975):
        return _T_975[dof - 1]
    z = Z_975
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    return z + g1 / dof + g2 / dof ** 2 + g3 / dof ** 3


@dataclass(frozen=True)
class SeedPair:
    """One RL seed's held-out (or pool) wins of the arm and its baseline, on the same episodes."""

    seed: int
    arm_wins: int
    arm_episodes: int
    base_wins: int
    base_episodes: int
    shared: tuple[int, int, int, int] | None = None
    """Where both runs kept their held-out episodes: the shared episodes won by both, by the arm only, by the
    baseline only, by neither (then the interval over the episodes is the paired one)."""

    def __post_init__(self) -> None:
        for wins, episodes, name in ((self.arm_wins, self.arm_episodes, "arm"),
                                     (self.base_wins, self.base_episodes, "base")):
            if episodes < 1 or not 0 <= wins <= episodes:
                raise ValueError(f"seed {self.seed}: {name}_wins must be in [0, {name}_episodes] with "
                                 f"{name}_episodes >= 1, got {wins} of {episodes}")
        if self.shared is not None and (len(self.shared) != 4 or min(self.shared) < 0 or sum(self.shared) < 1):
            raise ValueError(f"seed {self.seed}: shared must be four non-negative counts, got {self.shared}")

    @property
    def difference(self) -> float:
        """Arm minus baseline success rate."""
        return self.arm_wins / self.arm_episodes - self.base_wins / self.base_episodes


@dataclass(frozen=True)
class PairedDifference:
    """Arm minus baseline success, paired by seed (rates in [−1, 1]).

    `mean`: mean over seeds of the per-seed differences (`per_seed`); `low`/`high`: its 95% interval by `method`
    ("t over seeds" or "pooled episodes", module doc); `episodes_low`/`episodes_high`: the pooled-episode
    interval, also when the t interval is the one used; `verdict`: "helps" / "hurts" when a t interval excludes
    0, else "cannot tell"; `spread`: one seed's paired-difference standard deviation behind `seeds_for_target`
    (None when unknown), from `spread_source`; `episodes`: held-out episodes per run (each arm, each seed)."""

    seeds: tuple[int, ...]
    per_seed: tuple[float, ...]
    episodes: int
    mean: float
    low: float
    high: float
    method: str
    episodes_low: float
    episodes_high: float
    verdict: str
    target: float
    spread: float | None
    spread_source: str | None
    seeds_for_target: int | None
    episodes_for_target: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seeds": list(self.seeds), "per_seed": list(self.per_seed),
                "half_width": self.half_width}


def paired_spread(differences: Sequence[float], baseline_rates: Sequence[float]) -> tuple[float | None, str | None]:
    """The standard deviation of one seed's paired difference and where it came from (module doc); (None, None)
    when neither the pairs nor the baseline's seeds measure it, or it measures 0."""
    if len(differences) >= 2:
        spread, source = statistics.stdev(differences), "paired seeds"
    elif len(baseline_rates) >= 2:
        spread, source = math.sqrt(2) * statistics.stdev(baseline_rates), "baseline seeds × √2"
    else:
        return None, None
    return (spread, source) if spread > 0 else (None, None)


def seeds_for_target(spread: float | None, target: float) -> int | None:
    """The fewest seeds k >= 2 with t(0.975, k−1) · spread / √k <= target; None without a spread."""
    if target <= 0:
        raise ValueError(f"target: expected > 0, got {target}")
    if spread is None:
        return None
    # t > z, so no k <= (z · spread / target)² suffices: the search starts there
    k = max(2, math.floor((Z_975 * spread / target) ** 2))
    while t_quantile_975(k - 1) * spread / math.sqrt(k) > target:
        k += 1
    return k


def episodes_for_target(rate_a: float, rate_b: float, target: float) -> int:
    """Episodes per arm for a ±`target` 95% interval of the difference of two independent rates:
    ⌈z² (p_a(1−p_a) + p_b(1−p_b)) / target²⌉, at least 1."""
    if target <= 0:
        raise ValueError(f"target: expected > 0, got {target}")
    variance = rate_a * (1 - rate_a) + rate_b * (1 - rate_b)
    return max(1, math.ceil(Z_975 ** 2 * variance / target ** 2 - 1e-9))


def paired_difference(pairs: Sequence[SeedPair], *, target: float = 0.03,
                      baseline_rates: Sequence[float] = ()) -> PairedDifference:
    """The paired difference of `pairs` with its 95% interval and what a ±`target` answer needs (module doc).
    `baseline_rates`: the baseline's success per seed (all its seeds), for the spread when there is one pair."""
    if not pairs:
        raise ValueError("pairs: expected at least one seed with both arms, got none")
    if len({p.seed for p in pairs}) != len(pairs):
        raise ValueError(f"pairs: each seed once, got seeds {[p.seed for p in pairs]}")
    diffs = [p.difference for p in pairs]
    k = len(diffs)
    mean = statistics.fmean(diffs)
    arm_wins, arm_n = sum(p.arm_wins for p in pairs), sum(p.arm_episodes for p in pairs)
    base_wins, base_n = sum(p.base_wins for p in pairs), sum(p.base_episodes for p in pairs)
    if all(p.shared for p in pairs):  # every seed's episodes matched one by one
        counts = [sum(c) for c in zip(*(p.shared for p in pairs), strict=True)]  # type: ignore[misc]
        episodes_low, episodes_high = paired_success_difference_interval(*counts)
        episodes_method = "paired episodes"
    else:
        episodes_low, episodes_high = success_difference_interval(arm_wins, arm_n, base_wins, base_n)
        episodes_method = "pooled episodes"
    sd = statistics.stdev(diffs) if k >= 2 else 0.0
    if k >= MIN_SEEDS_FOR_T and sd > 0:
        half = t_quantile_975(k - 1) * sd / math.sqrt(k)
        method, low, high = "t over seeds", mean - half, mean + half
        verdict = "helps" if low > 0 else "hurts" if high < 0 else "cannot tell"
    else:
        method, low, high, verdict = episodes_method, episodes_low, episodes_high, "cannot tell"
    spread, source = paired_spread(diffs, baseline_rates)
    return PairedDifference(
        seeds=tuple(p.seed for p in pairs), per_seed=tuple(diffs), episodes=min(p.arm_episodes for p in pairs),
        mean=mean, low=low, high=high, method=method, episodes_low=episodes_low, episodes_high=episodes_high,
        verdict=verdict, target=target, spread=spread, spread_source=source,
        seeds_for_target=seeds_for_target(spread, target),
        episodes_for_target=episodes_for_target(arm_wins / arm_n, base_wins / base_n, target))


@dataclass(frozen=True)
class PairedEpisodes:
    """Success of `second` minus `first` on the episodes both played (rates in [−1, 1]).

    `episodes`: the shared episodes; `won_both`, `first_only` (won before, lost after), `second_only`, `neither`:
    their counts; `low`/`high`: the 95% interval of `difference` (Newcombe, paired); `mcnemar_p`: McNemar's
    exact two-sided p-value that the two win as often; `verdict`: "better" / "worse" when the interval excludes
    0, else "cannot tell"."""

    episodes: int
    won_both: int
    first_only: int
    second_only: int
    neither: int
    difference: float
    low: float
    high: float
    mcnemar_p: float
    verdict: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def mcnemar_p(first_only: int, second_only: int) -> float:
    """McNemar's exact two-sided p-value: the discordant episodes split as a fair coin would (1.0 when none)."""
    if first_only < 0 or second_only < 0:
        raise ValueError(f"counts: expected non-negative, got {first_only}, {second_only}")
    n = first_only + second_only
    tail = sum(math.comb(n, i) for i in range(min(first_only, second_only) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_episodes(first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]) -> PairedEpisodes | None:
    """`PairedEpisodes` of two evaluations' episode records (`trainer.validation.EPISODE_FIELDS`: matched by
    `env_spec` and `seed`, counted by `won`); None when they share no episode."""
    before = {(e["env_spec"], e["seed"]): bool(e["won"]) for e in first}
    after = {(e["env_spec"], e["seed"]): bool(e["won"]) for e in second}
    shared = before.keys() & after.keys()
    if not shared:
        return None
    both = sum(before[k] and after[k] for k in shared)
    first_only = sum(before[k] and not after[k] for k in shared)
    second_only = sum(after[k] and not before[k] for k in shared)
    neither = len(shared) - both - first_only - second_only
    low, high = paired_success_difference_interval(both, second_only, first_only, neither)
    return PairedEpisodes(episodes=len(shared), won_both=both, first_only=first_only, second_only=second_only,
                          neither=neither, difference=(second_only - first_only) / len(shared), low=low, high=high,
                          mcnemar_p=mcnemar_p(first_only, second_only),
                          verdict="better" if low > 0 else "worse" if high < 0 else "cannot tell")
