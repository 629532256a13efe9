"""Dynamic sampling (DAPO's filter-groups, as verl / verl-agent run it) and group-diversity statistics.

A GRPO group whose rollouts all have the same outcome has A_seq = 0 on every row: it carries no outcome
signal, only cost. After a supervised warm start the policy is close to deterministic and many groups are
like that. `collect_informative` plays rounds of tasks, keeps the groups whose rollouts disagree (some won,
some lost; with a graded outcome, different scores) and stops once it has the groups it wants or after `max_rounds` rounds; the step then trains on
the kept groups. `group_diversity` measures the same thing on any set of trajectories (a step, the pool
evaluation), with the sampled negative log-likelihood per token as the estimate of the sampling entropy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentgym_opsd.records import Trajectory, groups_of

__all__ = ["SamplingReport", "collect_informative", "group_diversity", "is_informative"]


def is_informative(group: Sequence[Trajectory], outcome: str = "won") -> bool:
    """Whether the group's rollouts that ran (no infrastructure error) differ in outcome: some won and some
    lost, or (`outcome="score"`) not all with the same score."""
    outcomes = {t.outcome(outcome) for t in group if t.error is None}
    return len(outcomes) >= 2


def group_diversity(trajectories: Sequence[Trajectory], *, prefix: str = "", outcome: str = "won") -> dict[str, float]:
    """`mixed_group_share`: fraction of groups whose outcomes differ (`is_informative`); `sampled_nll_per_token`: mean negative
    log-probability of the sampled response tokens, an unbiased estimate of the per-token entropy of the
    sampling distribution (at its temperature)."""
    groups = groups_of(trajectories)
    logprobs = [lp for t in trajectories for turn in t.turns for lp in turn.response_logprobs]
    return {
        f"{prefix}mixed_group_share": (sum(is_informative(g, outcome) for g in groups.values()) / len(groups)
                                       if groups else 0.0),
        f"{prefix}sampled_nll_per_token": -sum(logprobs) / len(logprobs) if logprobs else 0.0,
    }


@dataclass
class SamplingReport:
    """What one step's dynamic sampling did: rounds played, groups seen, kept (informative) and dropped."""

    rounds: int = 0
    groups_seen: int = 0
    informative_groups: int = 0  # seen with both outcomes (kept or beyond the want)
    kept_groups: int = 0
    dropped_groups: int = 0
    fallback: bool = False  # no informative group within the cap: the last round's groups were kept

    def metrics(self) -> dict[str, float]:
        return {"sampling/rounds": float(self.rounds), "sampling/groups_seen": float(self.groups_seen),
                "sampling/kept_groups": float(self.kept_groups), "sampling/dropped_groups": float(self.dropped_groups),
                "sampling/mixed_group_share": self.informative_groups / self.groups_seen if self.groups_seen else 0.0,
                "sampling/fallback": float(self.fallback)}


def collect_informative(
    play_round: Callable[[int], list[Trajectory]],
    *,
    want_groups: int,
    max_rounds: int,
    keep_going: Callable[[int], bool] | None = None,
    outcome: str = "won",
) -> tuple[list[Trajectory], SamplingReport]:
    """Play rounds (`play_round(round_index)` returns that round's trajectories, whole groups) until
    `want_groups` informative groups are kept or `max_rounds` rounds were played; returns the kept groups'
    trajectories (at most `want_groups` groups, in the order found) and the report.

    `keep_going(kept)` decides whether another round is needed (default: fewer than `want_groups` kept); data
    parallel passes a collective version, so every rank plays the same number of rounds. When no round
    found an informative group, the last round's groups are returned (`report.fallback`): their outcome
    advantage is zero, so the step only applies the per-turn penalty, and the run does not stall.
    """
    if want_groups < 1 or max_rounds < 1:
        raise ValueError(f"want_groups and max_rounds must be >= 1, got {want_groups} and {max_rounds}")
    keep_going = keep_going or (lambda kept: kept < want_groups)
    report = SamplingReport()
    kept: list[list[Trajectory]] = []
    last: list[list[Trajectory]] = []  # the last round's groups
    while report.rounds < max_rounds and (report.rounds == 0 or keep_going(len(kept))):
        last = list(groups_of(play_round(report.rounds)).values())
        report.rounds += 1
        for group in last:
            report.groups_seen += 1
            informative = is_informative(group, outcome)
            report.informative_groups += informative
            if informative and len(kept) < want_groups:
                kept.append(group)
            else:
                report.dropped_groups += 1
    if not kept:
        report.fallback = True
        kept = last
        report.dropped_groups -= len(kept)
    report.kept_groups = len(kept)
    return [t for group in kept for t in group], report
