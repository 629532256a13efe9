"""The policy objective: clipped surrogate (asymmetric clip), low-variance KL, entropy bonus.

All functions take response-aligned (rows, R) tensors with a `mask` and return SUMS over the masked tokens;
the caller divides by the number of response tokens of the whole step, so that summing the micro-batch losses
gives the token-mean over the step (micro-batching never changes the objective). The mask may weight its tokens
(`row_loss_weights`): `algorithm.loss_agg_mode` decides whether every token of the step counts alike or every
trajectory does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LOSS_AGG_MODES", "LossTerms", "StartDrift", "clipped_policy_loss", "kl_k3", "policy_objective",
           "row_loss_weights", "START_RATIO_BOUND"]

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean")
"""How the step's token losses are averaged (verl's `loss_agg_mode` names; a sequence here is a whole multi-turn
trajectory): `token-mean` weighs every response token of the step alike (the paper's choice), so a trajectory
weighs by its token count; `seq-mean-token-mean` averages each trajectory over its own tokens, then the
trajectories, so each weighs alike, however many turns it ran."""

START_RATIO_BOUND = 0.05
"""|r - 1| that the PPO ratio of a token may show before the first optimiser step of an update (where it is 1
in exact arithmetic). π_old is the trainer's own pass in the update's packed layout, so in bf16 too it rounds
as the update's first forward does (no deviation at all, docs/results.md); reusing the sampler's
numbers as π_old (float32 only) differs by float rounding. `tests/test_precision.py` holds the trainer to it."""


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 0.0,
    tis_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sum over tokens of −min(r·A, clip(r, 1−clip_low, 1+clip_high)·A) and the number of clipped tokens.

    `advantages` is (rows, R) (a turn's advantage broadcast over its tokens, or per token). With
    `clip_ratio_c` > 1 (dual clip, verl's `clip_ratio_c`) a token with A < 0 loses at most `clip_ratio_c·|A|`:
    a ratio that has run far above 1 on a bad action no longer drives an unbounded update. A token counts as
    clipped when either clip chose the branch whose gradient is zero. `tis_weights` (rows, R), no gradient:
    each token's term times its truncated importance weight π_old / π_sampler (`trainer/tis.py`).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped  # the max picked the clipped branch (gradient is zero there)
    if clip_ratio_c > 0:
        cap = -clip_ratio_c * advantages  # > 0 where A < 0
        capped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(capped, cap, per_token)
        was_clipped = was_clipped | capped
    if tis_weights is not None:
        per_token = per_token * tis_weights.detach()
    return (per_token * mask).sum(), (was_clipped & mask.bool()).sum()


def row_loss_weights(mode: str, row_trajectory: Sequence[int], row_tokens: Sequence[int], *,
                     total_tokens: float | None = None, num_trajectories: float | None = None) -> list[float]:
    """Each row's token weight under `mode` (`LOSS_AGG_MODES`), scaled so that the step's tokens weigh
    `total_tokens` in all, as under `token-mean`; the objective's token-mean then becomes the mode's mean.

    `row_trajectory[i]` names row i's trajectory (any hashable id), `row_tokens[i]` its response tokens. With
    several ranks, `total_tokens` and `num_trajectories` are the step's totals over all of them (each rank holds
    whole trajectories); by default this rank's. `seq-mean-token-mean`: a row of trajectory j weighs
    total_tokens / (num_trajectories · tokens of j), so every trajectory's tokens weigh total / num_trajectories.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode: expected one of {LOSS_AGG_MODES}, got {mode!r}")
    if len(row_trajectory) != len(row_tokens):
        raise ValueError(f"{len(row_trajectory)} rows' trajectories for {len(row_tokens)} rows' token counts")
    if mode == "token-mean":
        return [1.0] * len(row_tokens)
    per_trajectory: dict[int, int] = {}
    for traj, tokens in zip(row_trajectory, row_tokens, strict=True):
        per_trajectory[traj] = per_trajectory.get(traj, 0) + int(tokens)
    total = float(sum(per_trajectory.values())) if total_tokens is None else float(total_tokens)
    count = float(len(per_trajectory)) if num_trajectories is None else float(num_trajectories)
    return [total / (count * per_trajectory[traj]) if per_trajectory[traj] else 0.0 for traj in row_trajectory]


def kl_k3(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Sum over tokens of the low-variance KL estimator k3 = exp(ref − logp) − (ref − logp) − 1 (≥ 0)."""
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)  # guard exp() against far-off reference tokens
    return ((torch.exp(log_ratio) - log_ratio - 1.0) * mask).sum()


@dataclass
class LossTerms:
    """Sums over the micro-batch's response tokens (divide by the step's token count for means)."""

    loss: Tensor
    policy: Tensor
    kl: Tensor
    entropy: Tensor
    clipped_tokens: Tensor
    approx_kl: Tensor  # sum of (old − new) log-prob over the tokens: verl's ppo_kl, the drift from pi_old


def policy_objective(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    entropy: Tensor | None,
    ref_logp: Tensor | None,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    entropy_coef: float,
    num_tokens: int,
    clip_ratio_c: float = 0.0,
    tis_weights: Tensor | None = None,
) -> LossTerms:
    """Micro-batch contribution to the token-mean loss: (policy + kl_coef·KL − entropy_coef·H) / num_tokens.
    `mask`: 1 on response tokens, or each token's weight (`row_loss_weights`), which weighs all three terms."""
    mask = mask.to(logp.dtype)
    policy, clipped = clipped_policy_loss(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high,
                                          clip_ratio_c=clip_ratio_c, tis_weights=tis_weights)
    kl = kl_k3(logp, ref_logp, mask) if ref_logp is not None and kl_coef > 0 else logp.new_zeros(())
    ent = (entropy * mask).sum() if entropy is not None else logp.new_zeros(())
    loss = (policy + kl_coef * kl - entropy_coef * ent) / max(num_tokens, 1)
    return LossTerms(loss=loss, policy=policy.detach(), kl=kl.detach(), entropy=ent.detach(),
                     clipped_tokens=clipped.detach(), approx_kl=((old_logp - logp.detach()) * mask).sum())


class StartDrift:
    """How far the update's log-probs are from π_old before the first optimiser step, where they should be
    equal: the float-rounding gap between the sampler (or the recomputation) and the training forward pass.
    Metrics: `logprob_gap/mean`, `logprob_gap/max` (nats per token) and `ppo/start_ratio_max_dev`
    (max |r - 1|), over the tokens of the step's first mini-batch."""

    def __init__(self) -> None:
        self.total, self.count, self.max = 0.0, 0.0, 0.0

    def add(self, logp: Tensor, old_logp: Tensor, mask: Tensor) -> None:
        gap = (logp.float() - old_logp.float()).abs()[mask.bool()]
        if gap.numel():
            self.total += float(gap.sum())
            self.count += float(gap.numel())
            self.max = max(self.max, float(gap.max()))

    def metrics(self, all_reduce: Callable[..., list[float]] | None = None) -> dict[str, float]:
        """The step's numbers (`all_reduce(values, op=...)`: combine the ranks' parts)."""
        total, count, top = self.total, self.count, self.max
        if all_reduce is not None:
            total, count = all_reduce([total, count])
            top = all_reduce([top], op="max")[0]
        return {"logprob_gap/mean": total / count if count else 0.0, "logprob_gap/max": top,
                "ppo/start_ratio_max_dev": math.expm1(top)}
